"""Co-teaching (Han et al., NeurIPS 2018): two networks; each trains on the samples its peer finds
small-loss in the batch, so the errors of one are not reinforced by itself."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common.decimals import as_written
from common.errors import ConfigError
from models.peer_pair import PeerPair
from task.learners.base import Batch, BatchLoss


def kept_count(batch_size: int, forget_rate: float) -> int:
    """How many small-loss samples each network passes on: floor((1 - forget_rate) * B), at least one,
    with the rate taken as the decimal it is written as ((1 - 0.8) * 10 is 1.9999999999999996 in binary
    floats; as decimals it is 2)."""
    return max(1, math.floor((1 - as_written(forget_rate)) * batch_size))


def small_loss_rows(losses: torch.Tensor, keep: int) -> torch.Tensor:
    """The rows of the ``keep`` smallest losses (ties broken by row order)."""
    return torch.argsort(losses.detach(), stable=True)[:keep]


class Coteaching:
    """The Co-teaching learner at this round's ``forget_rate`` (the server's R(T) schedule)."""

    def __init__(self, forget_rate: float) -> None:
        self.forget_rate = forget_rate

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """Both networks' cross-entropies on the samples their peer kept; reports their mean."""
        if not isinstance(model, PeerPair):
            raise ConfigError(f"learner=coteaching needs a PeerPair of two networks, not a {type(model).__name__}")
        x = batch.inputs()
        first_losses = F.cross_entropy(model.first(x), batch.labels, reduction="none")
        second_losses = F.cross_entropy(model.second(x), batch.labels, reduction="none")
        keep = kept_count(x.shape[0], self.forget_rate)
        # Each network learns from what its peer finds clean (normalised by the kept count).
        first_loss = first_losses[small_loss_rows(second_losses, keep)].mean()
        second_loss = second_losses[small_loss_rows(first_losses, keep)].mean()
        return BatchLoss(first_loss + second_loss, (first_loss + second_loss) / 2)
