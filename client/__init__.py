"""Client side: local training and evaluation (plain PyTorch) and the Flower ClientApp built on them."""
