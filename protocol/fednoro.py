"""FedNoRo's messages: its train instruction, and the detection query ``query.class_loss``.

- ``train`` with plug-in ``fednoro`` and ``FedNoRoIns``: local training with the logit-adjusted
  loss; a client the server flagged noisy also distils the global model with weight ``kd_weight``.
- ``query.class_loss`` (arrays: the warmed-up global model; config: ``ClassLossIns``) ->
  ``ClassLossRes``: the model's mean cross-entropy per class of the client's given labels, and which
  classes the client has (a 0/1 mask; per-class sample counts instead when the instruction asks). One
  C-vector of floats and one of integers per detection (once per run by default): never per-sample
  values or labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import MessageType

from common.validation import Checked, Flag, Interval, Options, option

PLUGIN = "fednoro"
CLASS_LOSS = f"{MessageType.QUERY}.class_loss"
# How a class the client has no sample of enters the logit adjustment tau * log(pi): log 0 = -inf
# (the released code), or pi floored at ABSENT_FLOOR first.
ABSENT_CLASSES = ("neg_inf", "floor")
ABSENT_FLOOR = 1e-8
# The images the detection losses are scored on: the evaluation transform, or one seeded draw of
# the training augmentation (as the released code's central pass over the training set).
DETECT_TRANSFORMS = ("eval", "train")


@dataclass(frozen=True)
class ClassLossIns(Checked):
    """A ``query.class_loss`` instruction.

    transform: ``eval`` | ``train`` (``DETECT_TRANSFORMS``). server_round: the round the detection
        precedes (seeds the training augmentation's draw). counts: reply with each class's sample
        count instead of the present-class mask.
    """

    transform: str = option(Options(DETECT_TRANSFORMS))
    server_round: int = option(Interval(int, 0), default=0)
    counts: bool = option(Flag(), default=False)


@dataclass(frozen=True)
class FedNoRoIns(Checked):
    """What a FedNoRo client trains with this round.

    noisy: the server flagged this client noisy (after the warm-up): it distils the global model.
    kd_weight: lambda_t, the distillation's weight in [0, 1] (0 in the warm-up and for clean clients).
    temperature: the teacher's softmax temperature T (> 0; 0.8 sharpens).
    la_tau: the logit adjustment's strength tau (>= 0; 0 turns it off).
    absent_classes: ``neg_inf`` | ``floor`` (see ``ABSENT_CLASSES``).
    """

    noisy: bool = option(Flag())
    kd_weight: float = option(Interval(float, 0.0, 1.0))
    temperature: float = option(Interval(float, 0.0, closed="neither"))
    la_tau: float = option(Interval(float, 0.0))
    absent_classes: str = option(Options(ABSENT_CLASSES))


@dataclass(frozen=True)
class ClassLossRes:
    """A ``query.class_loss`` reply: per class c of the given labels, the mean cross-entropy of the
    sent model (0.0 for a class the client lacks), and either ``present`` (1 where the client has
    the class, else 0) or, when the instruction asks, ``counts`` (its samples of the class)."""

    losses: tuple[float, ...]
    present: tuple[int, ...] | None = None
    counts: tuple[int, ...] | None = None

    def presence(self) -> tuple[int, ...]:
        """1 where the client has the class, else 0 (from whichever of the two it sent)."""
        given = self.present if self.present is not None else self.counts
        return tuple(int(value > 0) for value in given or ())
