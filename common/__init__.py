"""The bottom layer: errors, value checks, seeded random streams, atomic files and the two-way GMM
split. Imports neither Flower, torch nor anything else of the project."""
