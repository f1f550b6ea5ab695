"""Datasets, federated partitions, label-noise models and reproducible scenes. Never imports Flower."""
