"""One local training run's settings and what it reports: what a server asks of a client in a
``train`` message, and what comes back.

Torch-free, so strategies and the protocol can carry both without importing the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from common.validation import Choice, Integer, Real, check_fields, rule

PROX_NORMS = ("squared", "l2")


@dataclass(frozen=True)
class LocalTraining:
    """Local SGD settings; the defaults are FedCorr's (Appendix B: SGD, momentum 0.5, no weight decay,
    5 local epochs, batch 10). ``conf/strategy/local/sgd.yaml`` holds the run defaults.

    lr: the learning rate (> 0).
    momentum: SGD momentum in [0, 1); weight_decay: L2 weight decay (>= 0).
    epochs: passes over the local set; batch_size: samples per step.
    mixup_alpha: 0 trains on the batches as they are; > 0 mixes each batch with a random permutation
        of itself using one lambda ~ Beta(alpha, alpha) per batch.
    prox_weight: 0 adds nothing; > 0 adds prox_weight * prox(w, w_global) to the loss. FedCorr's
        weight is beta * mu_hat_k; FedProx's mu/2 with ``squared``.
    prox_norm: ``squared`` is ||w - w_global||^2 (FedCorr eq. 5); ``l2`` is the unsquared norm.
    """

    lr: float = field(metadata=rule(Real(low=0, low_open=True)))
    momentum: float = field(default=0.5, metadata=rule(Real(low=0, below=1)))
    weight_decay: float = field(default=0.0, metadata=rule(Real(low=0)))
    epochs: int = field(default=5, metadata=rule(Integer(low=1)))
    batch_size: int = field(default=10, metadata=rule(Integer(low=1)))
    mixup_alpha: float = field(default=0.0, metadata=rule(Real(low=0)))
    prox_weight: float = field(default=0.0, metadata=rule(Real(low=0)))
    prox_norm: str = field(default="squared", metadata=rule(Choice(PROX_NORMS)))

    def __post_init__(self) -> None:
        check_fields(self)

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
