"""What evaluating a model on a labelled set reports. Torch-free, so the protocol can carry it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scores:
    """loss: mean cross-entropy; accuracy: share of argmax == label; num_examples: the set's size."""

    loss: float
    accuracy: float
    num_examples: int
