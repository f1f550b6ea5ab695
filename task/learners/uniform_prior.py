"""FedDiv's local objective (Li et al., AAAI 2024, Sec. 3.3): mixup cross-entropy plus eta times a
regulariser that pulls the batch's mean prediction toward the uniform distribution,
L_reg = sum_c (1/C) log((1/C) / q_bar_c), q_bar the mean softmax of the mixed batch. On non-IID data
it keeps a client with few classes from forgetting the others (eta = 1; eta = 0 for IID data)."""

from __future__ import annotations

import math

import torch
from torch import nn

from task.learners.base import Batch, BatchLoss
from task.learners.mixup import Mixup


def uniform_prior_penalty(logits: torch.Tensor) -> torch.Tensor:
    """KL(uniform || mean softmax of ``logits``): sum_c (1/C) log((1/C) / q_bar_c)."""
    classes = logits.shape[1]
    mean = torch.softmax(logits, dim=1).mean(dim=0)
    return -(torch.log(mean).sum() / classes) - math.log(classes)


class MixupUniformPrior(Mixup):
    """Mixup's loss (``task.learners.mixup``) + eta * ``uniform_prior_penalty`` on the mixed batch.

    alpha: mixup's Beta(alpha, alpha) (0: no mixing, plain cross-entropy); eta: the regulariser's weight.
    extra_forward: first pass the un-mixed batch through the model without using the output, as the
        released FedDiv code does: in training mode it moves batch-norm running statistics.
    """

    def __init__(self, alpha: float, eta: float, generator: torch.Generator, extra_forward: bool = False) -> None:
        super().__init__(alpha, generator)
        self.eta = eta
        self.extra_forward = extra_forward

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The batch's mixed loss plus the regulariser; reports the mixed loss."""
        x = batch.inputs()
        if self.extra_forward:
            with torch.no_grad():
                model(x)
        if self.alpha > 0:
            mix = self.draw(x.shape[0], x.device)
            out = model(mix.inputs(x))
            loss = mix.loss(out, batch.labels)
        else:
            out = model(x)
            loss = nn.functional.cross_entropy(out, batch.labels)
        objective = loss + self.eta * uniform_prior_penalty(out) if self.eta else loss
        return BatchLoss(objective, loss)
