"""A second, augmented view of a uint8 image batch: FedLSR's ``Augment(x)`` (Sec. 4.1).

Grayscale images get a random rotation within +-30 degrees (MNIST, Fashion-MNIST); colour images a
random horizontal flip, SimCLR's colour distortion (brightness, contrast and saturation factors in
[0.2, 1.8] and a hue shift in [-0.2, 0.2] turns, applied together with probability 0.8) and a random
grayscale with probability 0.2 (CIFAR-10, Clothing1M). Everything runs on the whole batch on its
device, every draw from the given generator; the view stays uint8 so the usual training transform
(crop, normalisation) follows it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

MAX_ROTATION_DEGREES = 30.0
COLOUR_STRENGTH = 0.8     # SimCLR's jitter at strength s = 1: brightness, contrast, saturation 0.8 s
HUE_RANGE = 0.2
COLOUR_PROBABILITY = 0.8
GRAYSCALE_PROBABILITY = 0.2
_LUMA = (0.299, 0.587, 0.114)


def _uniform(generator: torch.Generator, count: int, low: float, high: float, device: torch.device) -> torch.Tensor:
    draws = torch.rand(count, generator=generator, device=generator.device)
    return (low + (high - low) * draws).to(device)


def _draws(batch: int, per_sample: bool) -> int:
    """How many draws a random choice makes: one per image, or one shared by the batch."""
    return batch if per_sample else 1


def rotate(images: torch.Tensor, generator: torch.Generator, per_sample: bool = True) -> torch.Tensor:
    """Each image (or the batch) turned by an angle uniform in [-30, 30] degrees about its centre;
    corners that come from outside are black, as in torchvision's ``RandomRotation``."""
    batch = images.shape[0]
    angles = _uniform(generator, _draws(batch, per_sample), -MAX_ROTATION_DEGREES,
                      MAX_ROTATION_DEGREES, images.device).expand(batch) * (math.pi / 180.0)
    cos, sin = torch.cos(angles), torch.sin(angles)
    zero = torch.zeros_like(cos)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    pixels = images.float()
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    turned = F.grid_sample(pixels, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return turned.round().clamp(0, 255).to(torch.uint8)


def _gray(rgb: torch.Tensor) -> torch.Tensor:
    weights = torch.tensor(_LUMA, device=rgb.device, dtype=rgb.dtype).view(1, 3, 1, 1)
    return (rgb * weights).sum(dim=1, keepdim=True)


def _shift_hue(rgb: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Hue turned by ``shift`` (fractions of a full turn, one per image) through HSV, values in [0, 1]."""
    top, _ = rgb.max(dim=1, keepdim=True)
    bottom, _ = rgb.min(dim=1, keepdim=True)
    span = top - bottom
    safe = torch.where(span > 0, span, torch.ones_like(span))
    r, g, b = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
    hue = torch.where(top == r, ((g - b) / safe) % 6, torch.where(top == g, (b - r) / safe + 2, (r - g) / safe + 4))
    hue = torch.where(span > 0, hue / 6, torch.zeros_like(hue))
    hue = (hue + shift.view(-1, 1, 1, 1)) % 1.0
    saturation = torch.where(top > 0, span / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(top))
    # HSV -> RGB with the standard piecewise-linear channel functions.
    channels = []
    for offset in (5.0, 3.0, 1.0):
        k = (offset + hue * 6) % 6
        channels.append(top - top * saturation * torch.clamp(torch.minimum(k, 4 - k), 0, 1))
    return torch.cat(channels, dim=1)


def colour_distort(images: torch.Tensor, generator: torch.Generator, per_sample: bool = True) -> torch.Tensor:
    """Horizontal flip, SimCLR colour jitter (p = 0.8) and random grayscale (p = 0.2) of RGB images.
    The jitter applies brightness, contrast, saturation and hue in that fixed order."""
    batch, device = images.shape[0], images.device
    draws = _draws(batch, per_sample)

    def chance(probability: float) -> torch.Tensor:
        return (_uniform(generator, draws, 0.0, 1.0, device) < probability).expand(batch).view(-1, 1, 1, 1)

    def factor(low: float, high: float) -> torch.Tensor:
        return _uniform(generator, draws, low, high, device).expand(batch).view(-1, 1, 1, 1)

    x = images.float() / 255.0
    x = torch.where(chance(0.5), x.flip(-1), x)
    jitter = chance(COLOUR_PROBABILITY)
    low, high = 1 - COLOUR_STRENGTH, 1 + COLOUR_STRENGTH
    jittered = (x * factor(low, high)).clamp(0, 1)
    mean = _gray(jittered).mean(dim=(2, 3), keepdim=True)
    jittered = ((jittered - mean) * factor(low, high) + mean).clamp(0, 1)
    gray = _gray(jittered)
    jittered = ((jittered - gray) * factor(low, high) + gray).clamp(0, 1)
    jittered = _shift_hue(jittered, factor(-HUE_RANGE, HUE_RANGE).view(-1))
    x = torch.where(jitter, jittered, x)
    x = torch.where(chance(GRAYSCALE_PROBABILITY), _gray(x).expand_as(x), x)
    return (x * 255.0).round().clamp(0, 255).to(torch.uint8)


def second_view(images: torch.Tensor, generator: torch.Generator, per_sample: bool = True) -> torch.Tensor:
    """The augmented view of a uint8 batch (B, C, H, W): rotation for 1 channel, flip and colour
    distortion for 3 channels. ``per_sample`` False draws once for the whole batch (FedLSR's code)."""
    channels = images.shape[1]
    if channels == 1:
        return rotate(images, generator, per_sample)
    if channels == 3:
        return colour_distort(images, generator, per_sample)
    raise ValueError(f"a second view needs 1 or 3 channels, not {channels}")
