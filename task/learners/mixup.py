"""Mixup (Zhang et al. 2018): each batch mixed with a permutation of itself, targets mixed alike.
FedCorr's stage 1 trains with it (Sec. 3.2); as a learner it is the Fed-Mixup baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from task.learners.base import Batch, BatchLoss


def beta_stream(generator: torch.Generator) -> np.random.Generator:
    """A NumPy stream seeded from ``generator``: torch has no Beta sampler that takes a generator,
    so Beta draws come from this stream and every choice still flows from one source."""
    seed = torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device)
    return np.random.default_rng(int(seed))


@dataclass(frozen=True)
class Mix:
    """One batch's mixup: each sample weighted ``lam``, its partner ``sample[partner]`` 1 - lam."""

    lam: float
    partner: torch.Tensor

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Lam * x + (1 - lam) * x[partner]."""
        return torch.lerp(x[self.partner], x, self.lam)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against the mixed one-hot targets, without building them."""
        return self.lam * F.cross_entropy(out, y) + (1 - self.lam) * F.cross_entropy(out, y[self.partner])


class Mixup:
    """Draws lambda ~ Beta(alpha, alpha) and a partner permutation per batch, all from ``generator``.

    alpha: the Beta parameter (> 0; FedCorr and Fed-Mixup use 1).
    """

    def __init__(self, alpha: float, generator: torch.Generator) -> None:
        self.alpha = alpha
        self.generator = generator
        self._rng = beta_stream(generator)

    def draw(self, batch: int, device: torch.device) -> Mix:
        """The lambda and partner permutation of a batch of ``batch`` samples."""
        lam = float(self._rng.beta(self.alpha, self.alpha))
        partner = torch.randperm(batch, generator=self.generator, device=self.generator.device)
        return Mix(lam, partner.to(device))

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The mixed batch's loss against the mixed targets."""
        x = batch.inputs()
        mix = self.draw(x.shape[0], x.device)
        loss = mix.loss(model(mix.inputs(x)), batch.labels)
        return BatchLoss(loss, loss)
