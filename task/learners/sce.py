"""Symmetric cross-entropy (Wang et al., ICCV 2019): alpha CE + beta reverse CE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from task.learner_settings import SceSettings
from task.learners.base import Batch, BatchLoss

# The prediction is kept away from 0 before its log-free use, as in Wang et al.'s formulation.
PROBABILITY_FLOOR = 1e-7


def reverse_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_floor: float) -> torch.Tensor:
    """RCE = -sum_c p_c log q_c per sample, q the one-hot label clamped to [label_floor, 1], so the
    log of its zeros is log(label_floor); that is -log(label_floor) * (1 - p_y)."""
    p = torch.softmax(logits, dim=1).clamp(min=PROBABILITY_FLOOR, max=1.0)
    q = F.one_hot(labels, logits.shape[1]).to(p.dtype).clamp(min=label_floor, max=1.0)
    return -(p * q.log()).sum(dim=1)


def symmetric_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, settings: SceSettings) -> torch.Tensor:
    """Alpha CE + beta RCE, averaged over the batch."""
    ce = F.cross_entropy(logits, labels)
    rce = reverse_cross_entropy(logits, labels, settings.label_floor).mean()
    return settings.alpha * ce + settings.beta * rce


class SymmetricCrossEntropy:
    """The SCE learner with ``settings``."""

    def __init__(self, settings: SceSettings) -> None:
        self.settings = settings

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The batch's symmetric cross-entropy."""
        loss = symmetric_cross_entropy(model(batch.inputs()), batch.labels, self.settings)
        return BatchLoss(loss, loss)
