"""A small, fast CNN: the default network for Fashion-MNIST on a couple of CPU cores."""

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv(3x3, 32)-pool, conv(3x3, 64)-pool, then FC 128 and a linear classifier.

    Convolutions keep the spatial size and each pool halves it, so the 128-unit layer is sized for
    ``image_size`` // 4 squared maps (7x7 for 28x28 Fashion-MNIST, 2x2 for 8x8 digits). An adaptive
    pool keeps inputs of another size runnable.
    """

    MIN_IMAGE_SIZE = 4

    def __init__(self, num_classes: int, in_channels: int, image_size: int = 28) -> None:
        super().__init__()
        grid = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(grid),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * grid * grid, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) for an image batch (B, C, H, W)."""
        return self.classifier(self.features(x))
