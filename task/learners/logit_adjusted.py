"""FedNoRo's local objective (Wu et al., IJCAI 2023; ``docs/fednoro.md``): the
logit-adjusted cross-entropy, plus distillation from the frozen global model on noisy clients.

Logit adjustment shifts the logits by tau * log(pi), pi the client's class frequencies under its
given labels, which counters the client's class imbalance: z' = f(x) + tau log pi. A noisy client
minimises lambda KL(y_G || softmax(z')) + (1 - lambda) CE(z', y), where y_G = softmax(f_G(x) / T)
is the global model's sharpened prediction (T < 1) on the same inputs; the KL is averaged per sample.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from task.learners.base import Batch, BatchLoss


def class_log_prior(labels: np.ndarray, num_classes: int, floor: float | None = None) -> torch.Tensor:
    """The log class prior, log pi, over ``num_classes`` from the client's labels: -inf for a class it lacks, or, with
    ``floor``, log(max(pi, floor))."""
    prior = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes] / len(labels)
    if floor is not None:
        prior = np.maximum(prior, floor)
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(prior)).float()


def distillation(adjusted: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(adjusted)), averaged per sample. A class the logit
    adjustment removed (log-probability -inf) counts with log-probability 0, as in the released code,
    so an absent class cannot make the term infinite."""
    log_student = F.log_softmax(adjusted, dim=1)
    log_student = torch.where(torch.isfinite(log_student), log_student, torch.zeros_like(log_student))
    target = F.softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(log_student, target, reduction="batchmean")


class LogitAdjustedDistillation:
    """(1 - kd_weight) CE(f(x) + tau log pi, y) + kd_weight KL(y_G || softmax(f(x) + tau log pi)).

    log_prior: log pi per class (``class_log_prior``); tau: the adjustment's strength.
    teacher: the frozen global model (None, or ``kd_weight`` 0: no distillation).
    kd_weight: lambda in [0, 1]; temperature: the teacher's T.
    The reported loss is the adjusted cross-entropy.
    """

    def __init__(self, log_prior: torch.Tensor, tau: float, teacher: nn.Module | None = None,
                 kd_weight: float = 0.0, temperature: float = 1.0) -> None:
        self.shift = tau * log_prior if tau else torch.zeros_like(log_prior)
        self.teacher = teacher if kd_weight > 0 else None
        self.kd_weight = kd_weight
        self.temperature = temperature

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The batch's objective and its adjusted cross-entropy."""
        x = batch.inputs()
        adjusted = model(x) + self.shift.to(x.device)
        ce = F.cross_entropy(adjusted, batch.labels)
        if self.teacher is None:
            return BatchLoss(ce, ce)
        with torch.no_grad():
            teacher_logits = self.teacher(x)
        kd = distillation(adjusted, teacher_logits, self.temperature)
        return BatchLoss((1 - self.kd_weight) * ce + self.kd_weight * kd, ce)
