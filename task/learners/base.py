"""What a local learner sees of one training batch, and what it must provide."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from data.transforms import BatchTransform


@dataclass(frozen=True)
class Batch:
    """One training batch.

    images: the uint8 images (B, C, H, W) on the training device, before any transform.
    labels: their int64 labels.
    transform: the training transform (augmentation + normalisation).
    generator: the stream every random choice of this local training draws from.
    """

    images: torch.Tensor
    labels: torch.Tensor
    transform: BatchTransform
    generator: torch.Generator

    def inputs(self) -> torch.Tensor:
        """The network input of the batch: the training transform of the images."""
        return self.transform(self.images, self.generator)


@dataclass(frozen=True)
class BatchLoss:
    """A learner's result on one batch: the objective to minimise and the loss it reports (the
    classification loss without regularisers, averaged over the batch)."""

    objective: torch.Tensor
    reported: torch.Tensor


class Learner(Protocol):
    """The local objective on one batch of ``model`` (in train mode)."""

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The batch's objective and reported loss."""
        ...
