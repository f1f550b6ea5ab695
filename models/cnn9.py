"""The 9-layer CNN of Co-teaching (Han et al., 2018), also used by FedLSR."""

import torch
from torch import nn


def _conv_bn_lrelu(in_channels: int, out_channels: int, kernel_size: int, padding: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding),
        nn.BatchNorm2d(out_channels),
        nn.LeakyReLU(0.01),
    ]


class CNN9(nn.Module):
    """Three blocks of three convolutions, each followed by BatchNorm and LeakyReLU(0.01).

    Blocks 1 and 2 are 3x3 "same" convolutions (128 and 256 channels) ending in a 2x2 max-pool and
    dropout(0.25). Block 3 is a 3x3 valid convolution to 512 channels, then 1x1 convolutions to 256
    and 128. Global average pooling feeds a linear classifier. The valid convolution needs at least
    3x3 maps after the two pools, hence the 12x12 minimum input.
    """

    MIN_IMAGE_SIZE = 12

    def __init__(self, num_classes: int, in_channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for width in (128, 256):
            for _ in range(3):
                layers += _conv_bn_lrelu(channels, width, 3, padding=1)
                channels = width
            layers += [nn.MaxPool2d(2), nn.Dropout(0.25)]
        layers += _conv_bn_lrelu(channels, 512, 3, padding=0)
        layers += _conv_bn_lrelu(512, 256, 1, padding=0)
        layers += _conv_bn_lrelu(256, 128, 1, padding=0)
        layers.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) for an image batch (B, C, H, W)."""
        return self.classifier(self.features(x))
