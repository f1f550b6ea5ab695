"""The ServerApp side: node discovery, strategy rounds, central evaluation, results, simulation."""
