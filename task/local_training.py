"""One local training run's settings and what it reports: what a server asks of a client in a
``train`` message, and what comes back.

Torch-free, so strategies and the protocol can carry both without importing the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from common.errors import InvalidValue
from common.validation import Choice, Integer, Real, check_fields, rule
from task.learner_options import LEARNERS, CoteachingOptions, LearnerSchedule, LsrOptions, SceOptions

PROX_NORMS = ("squared", "l2")
# The local optimiser, created afresh every local run: SGD (FedCorr and most papers), or Adam with
# torch's betas (0.9, 0.999) (FedNoRo's released code, methods.md B7).
OPTIMIZERS = ("sgd", "adam")

# Each learner's options travel under their own name in a train message (``lsr.gamma``); the key is
# the one protocol.codec reads (``NAMESPACED``).
_OWN_KEYS = {"namespaced": True}


@dataclass(frozen=True)
class LocalTraining:
    """Local SGD settings; the defaults are FedCorr's (Appendix B: SGD, momentum 0.5, no weight decay,
    5 local epochs, batch 10). ``conf/strategy/local/sgd.yaml`` holds the run defaults.

    lr: the learning rate (> 0).
    optimizer: ``sgd`` | ``adam`` (``OPTIMIZERS``).
    momentum: SGD momentum in [0, 1) (Adam uses its own betas); weight_decay: L2 weight decay (>= 0).
    epochs: passes over the local set; batch_size: samples per step.
    learner: the local objective (``task/learners/``): ``ce`` | ``mixup`` | ``sce`` | ``coteaching``
        | ``lsr``.
    mixup_alpha: the ``mixup`` learner's Beta(alpha, alpha) (> 0 when it is used): each batch is mixed
        with a random permutation of itself using one lambda per batch.
    lsr, sce, coteaching: the options of those learners (``task.learner_options``).
    prox_weight: 0 adds nothing; > 0 adds prox_weight * prox(w, w_global) to the loss. FedCorr's
        weight is beta * mu_hat_k; FedProx's mu/2 with ``squared``.
    prox_norm: ``squared`` is ||w - w_global||^2 (FedCorr eq. 5); ``l2`` is the unsquared norm.
    """

    lr: float = field(metadata=rule(Real(low=0, low_open=True)))
    optimizer: str = field(default="sgd", metadata=rule(Choice(OPTIMIZERS)))
    momentum: float = field(default=0.5, metadata=rule(Real(low=0, below=1)))
    weight_decay: float = field(default=0.0, metadata=rule(Real(low=0)))
    epochs: int = field(default=5, metadata=rule(Integer(low=1)))
    batch_size: int = field(default=10, metadata=rule(Integer(low=1)))
    learner: str = field(default="ce", metadata=rule(Choice(LEARNERS)))
    mixup_alpha: float = field(default=1.0, metadata=rule(Real(low=0)))
    prox_weight: float = field(default=0.0, metadata=rule(Real(low=0)))
    prox_norm: str = field(default="squared", metadata=rule(Choice(PROX_NORMS)))
    lsr: LsrOptions = field(default_factory=LsrOptions, metadata=_OWN_KEYS)
    sce: SceOptions = field(default_factory=SceOptions, metadata=_OWN_KEYS)
    coteaching: CoteachingOptions = field(default_factory=CoteachingOptions, metadata=_OWN_KEYS)

    def __post_init__(self) -> None:
        check_fields(self)
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
    """What a local training run reports: the local set size, the mean batch loss of the last epoch
    (without regularisers; NaN when no batch was trained) and the optimizer steps taken."""

    num_examples: int
    train_loss: float
    steps: int
