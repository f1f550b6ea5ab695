"""Server strategies (Flower Message-API ``Strategy`` subclasses) and a registry by name."""
