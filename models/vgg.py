"""VGG-11 with BatchNorm (Simonyan & Zisserman, 2015, configuration A) for small images."""

from typing import Literal

import torch
from torch import nn

# Configuration A: conv widths, "M" for a 2x2 max-pool.
_VGG11: tuple[int | Literal["M"], ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """3x3 conv+BN+ReLU layers and max-pools, then a linear classifier on the pooled 512-d features.

    As in CIFAR variants of VGG, the three-layer ImageNet classifier is replaced by one linear layer.
    Pools round up (``ceil_mode``) so odd or 1x1 maps never shrink to zero: 28x28 and 8x8 inputs
    run, while 32x32 and 224x224 are pooled exactly as in the original.
    """

    def __init__(self, config: tuple[int | Literal["M"], ...], num_classes: int, in_channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
            else:
                layers += [nn.Conv2d(channels, item, 3, padding=1), nn.BatchNorm2d(item), nn.ReLU()]
                channels = item
        layers.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) for an image batch (B, C, H, W)."""
        return self.classifier(self.features(x))


def vgg11(num_classes: int, in_channels: int) -> VGG:
    """VGG-11-BN (9,231,114 parameters for 3 channels, 10 classes)."""
    return VGG(_VGG11, num_classes, in_channels)
