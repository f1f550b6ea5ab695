"""Local learners: the client's objective on one batch, one learner per module, found by name.

Every round-based strategy trains with the learner its ``train.learner`` names; FedCorr's stage 1 uses
``mixup``. Their settings are torch-free in ``task.learner_settings``.
"""

from __future__ import annotations

import torch

from task.learner_settings import LearnerSchedule
from task.learners.base import Batch, BatchLoss, Learner
from task.learners.ce import CrossEntropy
from task.learners.coteaching import Coteaching
from task.learners.lsr import LocalSelfRegularisation
from task.learners.mixup import Mixup
from task.learners.sce import SymmetricCrossEntropy
from task.local_training import LocalTraining

__all__ = ["Batch", "BatchLoss", "Learner", "make_learner"]


def make_learner(cfg: LocalTraining, schedule: LearnerSchedule, generator: torch.Generator) -> Learner:
    """The learner ``cfg.learner`` with its options and this round's ``schedule``; its own random
    draws (Beta weights) come from ``generator``."""
    if cfg.learner == "mixup":
        return Mixup(cfg.mixup_alpha, generator)
    if cfg.learner == "sce":
        return SymmetricCrossEntropy(cfg.sce)
    if cfg.learner == "coteaching":
        return Coteaching(schedule.forget_rate)
    if cfg.learner == "lsr":
        return LocalSelfRegularisation(cfg.lsr, schedule.distill_weight, generator)
    return CrossEntropy()
