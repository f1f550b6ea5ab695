"""LeNet-5 (LeCun et al., 1998), the small network of FedCorr's Appendix C.2."""

import torch
from torch import nn

# The classical network sees 32x32 inputs, so its second convolution sees 14x14 maps.
_CLASSICAL_CONV_INPUTS = (32, 14)


class LeNet5(nn.Module):
    """Two conv(5x5)+max-pool stages and a 120-84-``num_classes`` classifier.

    On 32x32 inputs this is the classical network (62,006 parameters for 3 channels, 10 classes).
    A convolution whose input is smaller than in that network is zero-padded by 2, as LeCun padded
    28x28 MNIST digits to 32x32; this also lets 8x8 images through. The first fully connected layer
    is sized for ``image_size``; an adaptive pool keeps other input sizes runnable.
    """

    MIN_IMAGE_SIZE = 4

    def __init__(self, num_classes: int, in_channels: int, image_size: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size, channels = image_size, in_channels
        for out_channels, classical_size in zip((6, 16), _CLASSICAL_CONV_INPUTS):
            padding = 2 if size < classical_size else 0
            layers += [nn.Conv2d(channels, out_channels, 5, padding=padding), nn.ReLU(), nn.MaxPool2d(2)]
            size = (size + 2 * padding - 4) // 2
            channels = out_channels
        layers.append(nn.AdaptiveAvgPool2d(size))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * size * size, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) for an image batch (B, C, H, W)."""
        return self.classifier(self.features(x))
