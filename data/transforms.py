"""Batched image augmentation: resize, random or centre crop, horizontal flip, normalisation.

Everything runs on whole uint8 batches of shape (B, C, H, W); there is no per-sample Python work, so
a training step pays a handful of tensor operations, not one PIL round trip per image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from common.errors import ConfigError, InvalidValue
from common.validation import Checked, Flag, Interval, option


@dataclass(frozen=True)
class TransformSpec(Checked):
    """What a :class:`BatchTransform` does, in order: resize, (pad +) crop, flip, normalise. Each
    field's default is the step left out, so a dataset's empty block (``eval: {}``) is no transform."""

    resize: int | None = option(Interval(int, 1, or_none=True),
                                "resize to (resize, resize) first, antialiased bilinear; null keeps the size",
                                default=None)
    crop: int | None = option(Interval(int, 1, or_none=True),
                              "the output side: a random window when training, the centre one when evaluating",
                              default=None)
    pad: int = option(Interval(int, 0), "zeros on every side before the random crop (not when evaluating)",
                      default=0)
    flip: bool = option(Flag(), "a random horizontal flip with probability 0.5 when training", default=False)

    def check(self) -> None:
        """A pad needs a crop."""
        if self.pad > 0 and self.crop is None:
            raise InvalidValue("pad", self.pad, "a pad needs a crop size; set crop or use pad=0")


def _normalisation(mean: Sequence[float], std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and shift with x * scale - shift == (x / 255 - mean) / std, each of shape (C, 1, 1)."""
    mean_t: torch.Tensor | None
    std_t: torch.Tensor | None
    try:
        mean_t = torch.tensor([float(v) for v in mean], dtype=torch.float64)
        std_t = torch.tensor([float(v) for v in std], dtype=torch.float64)
    except (TypeError, ValueError):
        mean_t = std_t = None
    if mean_t is None or std_t is None or mean_t.numel() == 0 or mean_t.shape != std_t.shape:
        raise ConfigError(
            f"normalisation mean={mean!r} and std={std!r} are invalid; "
            "allowed are two non-empty lists of numbers of the same length (one value per channel)"
        )
    if not bool(torch.isfinite(mean_t).all()):
        raise ConfigError(f"normalisation mean={list(mean)} is invalid: allowed are finite numbers")
    if not bool((torch.isfinite(std_t) & (std_t > 0)).all()):
        raise ConfigError(f"normalisation std={list(std)} is invalid: allowed are finite numbers > 0")
    scale = (1.0 / (255.0 * std_t)).float().view(-1, 1, 1)
    shift = (mean_t / std_t).float().view(-1, 1, 1)
    return scale, shift


class BatchTransform:
    """Turns a uint8 batch (B, C, H, W) into a normalised float32 batch (B, C, h, w).

    When ``train`` is true the crop offset and the flip are drawn per sample from the generator
    given to each call (torch's global generator when none is given); otherwise the transform is
    deterministic: resize, centre crop, normalise.
    """

    def __init__(self, spec: TransformSpec, mean: Sequence[float], std: Sequence[float], train: bool) -> None:
        if not isinstance(spec, TransformSpec):
            raise ConfigError(f"spec={spec!r} is invalid: allowed is a TransformSpec")
        self.spec = spec
        self.train = bool(train)
        if spec.resize is not None:
            self._check_crop_fits(spec.resize, spec.resize)
        self._scale, self._shift = _normalisation(mean, std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec}, train={self.train})"

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """uint8 (B, C, H, W) -> float32 normalised (B, C, h, w); random choices only from `generator`."""
        self._check_batch(images)
        spec = self.spec
        x = images
        if spec.resize is not None and tuple(x.shape[-2:]) != (spec.resize, spec.resize):
            size = (spec.resize, spec.resize)
            x = F.interpolate(x.float(), size=size, mode="bilinear", align_corners=False, antialias=True)
        if self.train:
            x = self._random_crop_flip(x, generator)
        elif spec.crop is not None:
            x = _centre_crop(x, spec.crop)
        scale = self._scale.to(x.device)
        shift = self._shift.to(x.device)
        # float() copies a uint8 batch; a float x is already this call's own intermediate (resize
        # output), so normalising in place never touches the caller's tensor.
        return x.float().mul_(scale).sub_(shift)

    def _check_batch(self, images: torch.Tensor) -> None:
        if not isinstance(images, torch.Tensor):
            raise ConfigError(f"images of type {type(images).__name__} are invalid: allowed is a torch.Tensor")
        if images.dtype != torch.uint8 or images.ndim != 4:
            got = f"{images.dtype} {tuple(images.shape)}"
            raise ConfigError(f"images {got} are invalid: allowed is a uint8 tensor of shape (B, C, H, W)")
        channels = images.shape[1]
        if channels != self._scale.shape[0]:
            raise ConfigError(
                f"images have {channels} channels but mean/std have {self._scale.shape[0]} values; "
                "allowed is one mean and one std per channel"
            )
        if self.spec.resize is None:
            self._check_crop_fits(images.shape[-2], images.shape[-1])

    def _check_crop_fits(self, height: int, width: int) -> None:
        # Evaluation never pads, so there the window must fit the (resized) image itself.
        pad = self.spec.pad if self.train else 0
        limit = min(height, width) + 2 * pad
        if self.spec.crop is not None and self.spec.crop > limit:
            padded = f" padded by {pad}" if pad else ""
            raise ConfigError(
                f"transform.crop={self.spec.crop} does not fit {height}x{width} images{padded}: "
                f"allowed is crop <= {limit}"
            )

    def _random_crop_flip(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        spec = self.spec
        batch = x.shape[0]
        draw_device = generator.device if generator is not None else x.device
        if spec.crop is not None:
            if spec.pad:
                x = F.pad(x, (spec.pad,) * 4)
            draw: dict[str, Any] = dict(size=(batch,), generator=generator, device=draw_device)
            rows = torch.randint(0, x.shape[-2] - spec.crop + 1, **draw)
            cols = torch.randint(0, x.shape[-1] - spec.crop + 1, **draw)
            # unfold is a view of every window, (B, C, nH, nW, crop, crop); picking one per sample copies
            # only the output, with no per-pixel index tensor.
            windows = x.unfold(2, spec.crop, 1).unfold(3, spec.crop, 1)
            picks = torch.arange(batch, device=x.device)
            x = windows[picks, :, rows.to(x.device), cols.to(x.device)]
        if spec.flip:
            flips = torch.rand(batch, generator=generator, device=draw_device) < 0.5
            x = torch.where(flips.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)
        return x


def _centre_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    # When the margin is odd the extra pixel goes to the bottom/right.
    top = (x.shape[-2] - size) // 2
    left = (x.shape[-1] - size) // 2
    return x[..., top : top + size, left : left + size]


@dataclass(frozen=True)
class TransformPair:
    """The dataset's training and evaluation transforms (``dataset.transforms`` in the config)."""

    train: TransformSpec
    eval: TransformSpec

    def build(self, mean: Sequence[float], std: Sequence[float]) -> tuple[BatchTransform, BatchTransform]:
        """(train, eval) batch transforms normalising with the dataset's ``mean`` and ``std``."""
        return BatchTransform(self.train, mean, std, train=True), BatchTransform(self.eval, mean, std, train=False)

