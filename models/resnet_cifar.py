"""CIFAR-style ResNet-18/34 (He et al., 2016): 3x3 stride-1 stem, no max-pool, BasicBlocks."""

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN layers with an identity shortcut, or a 1x1 projection when the shape changes."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """ReLU of the two conv+BN layers' output plus the shortcut of ``x``."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """Stem conv(3x3, 64) + four stages of 64/128/256/512 channels (stride 1, 2, 2, 2) + linear head.

    Stride-2 convolutions are padded, so any input size down to 1x1 runs; the head sees the
    globally averaged 512-d features.
    """

    def __init__(self, blocks_per_stage: tuple[int, ...], num_classes: int, in_channels: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
        )
        stages: list[nn.Module] = []
        channels = 64
        for stage, n_blocks in enumerate(blocks_per_stage):
            width = 64 * 2**stage
            stride = 1 if stage == 0 else 2
            blocks = [BasicBlock(channels, width, stride)]
            blocks += [BasicBlock(width, width, 1) for _ in range(n_blocks - 1)]
            stages.append(nn.Sequential(*blocks))
            channels = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (B, num_classes) for an image batch (B, C, H, W)."""
        features = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(features, 1))


def resnet18(num_classes: int, in_channels: int) -> CifarResNet:
    """CIFAR ResNet-18: [2, 2, 2, 2] BasicBlocks (11,173,962 parameters for 3 channels, 10 classes)."""
    return CifarResNet((2, 2, 2, 2), num_classes, in_channels)


def resnet34(num_classes: int, in_channels: int) -> CifarResNet:
    """CIFAR ResNet-34: [3, 4, 6, 3] BasicBlocks (21,282,122 parameters for 3 channels, 10 classes)."""
    return CifarResNet((3, 4, 6, 3), num_classes, in_channels)
