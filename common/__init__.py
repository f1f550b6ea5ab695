"""Numerical helpers shared by the client and the server sides (no Flower, no torch)."""
