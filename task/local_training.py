"""One local training run's settings and what it reports: what a server asks of a client in a
``train`` message, and what comes back.

Torch-free, so strategies and the protocol can carry both without importing the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from common.errors import InvalidValue
from common.validation import Checked, Interval, Options, option
from task.learner_settings import LEARNERS, CoteachingSettings, LearnerSchedule, LsrSettings, SceSettings

PROX_NORMS = ("squared", "l2")
# The local optimiser, created afresh every local run: SGD (FedCorr and most papers), or Adam with
# torch's betas (0.9, 0.999) (FedNoRo's released code).
OPTIMIZERS = ("sgd", "adam")

_NON_NEGATIVE = Interval(float, 0, finite=True)


@dataclass(frozen=True)
class LocalTraining(Checked):
    """Local training settings (``conf/strategy/local/sgd.yaml``: FedCorr's Appendix B). Each
    learner's settings travel under its own name in a train message (``lsr.gamma``)."""

    lr: float = option(Interval(float, 0, closed="neither", finite=True), "the learning rate")
    optimizer: str = option(Options(OPTIMIZERS), "sgd | adam (torch's betas)")
    momentum: float = option(Interval(float, 0, 1, closed="left", finite=True), "SGD's momentum (Adam has its own)")
    weight_decay: float = option(_NON_NEGATIVE, "L2 weight decay")
    epochs: int = option(Interval(int, 1), "passes over the local set")
    batch_size: int = option(Interval(int, 1), "samples per step")
    learner: str = option(Options(LEARNERS), "the local objective (task/learners/)")
    mixup_alpha: float = option(_NON_NEGATIVE, "the mixup learner's Beta(alpha, alpha); > 0 when it is used")
    prox_weight: float = option(_NON_NEGATIVE, "> 0 adds prox_weight * prox(w, w_global) to the loss")
    prox_norm: str = option(Options(PROX_NORMS), "squared: ||w - w_global||^2 (FedCorr eq. 5) | l2: the norm")
    lsr: LsrSettings = option(meaning="the lsr learner's settings", namespaced=True)
    sce: SceSettings = option(meaning="the sce learner's settings", namespaced=True)
    coteaching: CoteachingSettings = option(meaning="the coteaching learner's settings", namespaced=True)

    def check(self) -> None:
        """A learner's own settings must allow it: mixup needs alpha > 0, Co-teaching a forget rate."""
        if self.learner == "mixup" and self.mixup_alpha <= 0:
            raise InvalidValue("mixup_alpha", self.mixup_alpha, "a number > 0 with learner=mixup")
        if self.learner == "coteaching" and self.coteaching.forget_rate is None:
            raise InvalidValue("coteaching.forget_rate", None, "a number in [0, 1): Co-teaching drops that "
                               "share of each batch and needs it set (usually the expected noise rate)")

    @property
    def peers(self) -> bool:
        """Whether the learner trains two networks (Co-teaching): the global model is then a pair."""
        return self.learner == "coteaching"

    def schedule_at(self, stage_round: int) -> LearnerSchedule:
        """What the server sends for the learner in a stage's round ``stage_round`` (counted from 0)."""
        return LearnerSchedule(
            distill_weight=self.lsr.weight_at(stage_round) if self.learner == "lsr" else 0.0,
            forget_rate=self.coteaching.forget_at(stage_round) if self.learner == "coteaching" else 0.0)

    def but(self, **changes: Any) -> LocalTraining:
        """A copy with ``changes`` (checked like any new instance)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class TrainStats:
    """What a local training run reports (the ``train`` reply's payload): the local set size, the mean
    batch loss of the last epoch (without regularisers; NaN when no batch was trained) and the
    optimizer steps taken."""

    num_examples: int
    train_loss: float
    steps: int
