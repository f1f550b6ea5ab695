"""FedLSR's local self-regularisation (Jiang et al., CIKM 2022, Algorithm 1).

Per batch: two views (the batch and ``data.second_view`` of it) through the same network; their
softmax predictions mixed with lambda ~ Beta(1, 1) (eq. 6) and sharpened (eq. 7) give the
classification loss; the divergence of their tempered predictions (eqs. 8-9) is the self-distillation
term, weighted by the server's gamma_t (eq. 10). LSR+ adds an entropy term (eq. 11).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from data.second_view import second_view
from task.learner_settings import LsrSettings
from task.learners.base import Batch, BatchLoss
from task.learners.mixup import beta_stream

# q1 and q2 are clamped to [1e-6, 1] before the divergence, for stability (Sec. 4.1).
TEMPERED_FLOOR = 1e-6


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (7): p_i^(1/T) / sum_j p_j^(1/T), row by row."""
    powered = p.pow(1.0 / temperature)
    return powered / powered.sum(dim=1, keepdim=True)


def classification_loss(sharpened: torch.Tensor, labels: torch.Tensor, form: str) -> torch.Tensor:
    """Loss_cls = CE(p_s, y), averaged over the batch: ``logits_ce`` feeds p_s to cross-entropy in the
    place of eq. (1)'s logits (the text's "p_s instead of logits in Eq. 1", and the released code; a
    bounded loss); ``nll`` is -log p_s[y]."""
    if form == "logits_ce":
        return F.cross_entropy(sharpened, labels)
    picked = sharpened.gather(1, labels.view(-1, 1)).squeeze(1)
    return -picked.clamp(min=torch.finfo(sharpened.dtype).tiny).log().mean()


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (8): softmax(o / T_d), clamped to [1e-6, 1]."""
    return torch.softmax(logits / temperature, dim=1).clamp(min=TEMPERED_FLOOR, max=1.0)


def _reduce(per_entry: torch.Tensor, reduction: str) -> torch.Tensor:
    """``elementwise_mean``: averaged over batch x classes (the released code's, the scale Table 2's
    gamma values were chosen at); ``sum``: summed over classes, averaged over the batch."""
    return per_entry.mean() if reduction == "elementwise_mean" else per_entry.sum(dim=1).mean()


def distillation(q1: torch.Tensor, q2: torch.Tensor, form: str, reduction: str) -> torch.Tensor:
    """Loss_reg: ``js``, eq. (9): (KL(q1 || U) + KL(q2 || U)) / 2 with U = (q1 + q2) / 2; ``l1``: |q1 - q2|."""
    if form == "l1":
        return _reduce((q1 - q2).abs(), reduction)
    middle = (q1 + q2) / 2
    kl1 = q1 * (q1.log() - middle.log())
    kl2 = q2 * (q2.log() - middle.log())
    return (_reduce(kl1, reduction) + _reduce(kl2, reduction)) / 2


def entropy(p: torch.Tensor) -> torch.Tensor:
    """The mean entropy of the rows of ``p``."""
    return -(p * p.clamp(min=torch.finfo(p.dtype).tiny).log()).sum(dim=1).mean()


def lsr_loss(o1: torch.Tensor, o2: torch.Tensor, labels: torch.Tensor, lam: float, weight: float,
             settings: LsrSettings) -> BatchLoss:
    """The LSR objective of the two views' logits ``o1``, ``o2`` with mixing weight ``lam`` and
    distillation weight ``weight`` (gamma_t); reports Loss_cls."""
    mixed = lam * torch.softmax(o1, dim=1) + (1 - lam) * torch.softmax(o2, dim=1)
    cls = classification_loss(sharpen(mixed, settings.sharpen_temperature), labels, settings.cls_loss)
    objective = cls
    if settings.distill != "none" and weight > 0:
        q1, q2 = tempered(o1, settings.distill_temperature), tempered(o2, settings.distill_temperature)
        objective = objective + weight * distillation(q1, q2, settings.distill, settings.reduction)
    if settings.entropy_weight > 0:
        if settings.entropy_form == "tempered":
            # The released code: the entropy of a softmax of the already tempered, clamped q1.
            term = entropy(torch.softmax(tempered(o1, settings.distill_temperature), dim=1))
        else:
            term = (entropy(torch.softmax(o1, dim=1)) + entropy(torch.softmax(o2, dim=1))) / 2
        objective = objective + settings.entropy_weight * term
    return BatchLoss(objective, cls)


class LocalSelfRegularisation:
    """The LSR learner with ``settings`` at this round's distillation ``weight`` (gamma_t)."""

    def __init__(self, settings: LsrSettings, weight: float, generator: torch.Generator) -> None:
        self.settings = settings
        self.weight = weight
        self._rng = beta_stream(generator)

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """Both views through ``model``, one lambda ~ Beta(1, 1) for the batch (the released code)."""
        original = batch.inputs()
        augmented = batch.transform(second_view(batch.images, batch.generator,
                                                self.settings.augment_draw == "sample"), batch.generator)
        lam = float(self._rng.beta(1.0, 1.0))
        return lsr_loss(model(original), model(augmented), batch.labels, lam, self.weight, self.settings)
