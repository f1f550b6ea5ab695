"""Aggregating client model states: weighted mean and coordinate-wise median, dtypes kept.

States are ``{name: np.ndarray}``; conversions to and from Flower's ``ArrayRecord`` are here too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord


def as_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    """An ``ArrayRecord`` as NumPy arrays by name."""
    return {key: array.numpy() for key, array in arrays.items()}


def as_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    """NumPy arrays by name as an ``ArrayRecord``."""
    return ArrayRecord({key: Array(value) for key, value in state.items()})


def peer_pair(first: ArrayRecord, second: ArrayRecord) -> ArrayRecord:
    """Two networks' arrays as one ``models.peer_pair.PeerPair`` state: ``first.<key>``, ``second.<key>``."""
    if list(first.keys()) != list(second.keys()):
        raise ValueError("the two networks of a pair must have the same arrays")
    state = {f"first.{key}": array for key, array in first.items()}
    state |= {f"second.{key}": array for key, array in second.items()}
    return ArrayRecord(state)


def weighted_average(states: Sequence[dict[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Average every array of the given model states (parameters and BN buffers alike), weighted.

    Accumulates in float64 and returns each array in its original dtype; integer buffers such as
    BatchNorm's ``num_batches_tracked`` are rounded rather than turned into floats.
    """
    if not states:
        raise ValueError("nothing to average: no client states")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    averaged: dict[str, np.ndarray] = {}
    for key, first in states[0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for state, weight in zip(states, weights):
            acc += np.asarray(state[key], dtype=np.float64) * (weight / total)
        rounded = np.rint(acc) if first.dtype.kind in "iub" else acc
        averaged[key] = np.asarray(rounded).astype(first.dtype)  # np.rint turns 0-d arrays into scalars
    return averaged


def average_buffers(states: Sequence[Mapping[str, np.ndarray]], parameters: Collection[str]) -> dict[str, np.ndarray]:
    """The plain (unweighted) mean of the arrays that are not ``parameters`` (BatchNorm's buffers),
    for the strategies whose server step treats the parameters apart (FedDyn, SCAFFOLD)."""
    buffers = [{key: np.asarray(value) for key, value in state.items() if key not in parameters} for state in states]
    return weighted_average(buffers, [1.0] * len(states)) if buffers[0] else {}


def coordinate_median(states: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The coordinate-wise median of every array of the given model states (Yin et al. 2018).

    Like ``weighted_average``: each array keeps its dtype, integer buffers are rounded. (Flower's
    FedMedian turns integer buffers into floats, and samples nodes outside the run's seed.)
    """
    if not states:
        raise ValueError("nothing to aggregate: no client states")
    median: dict[str, np.ndarray] = {}
    for key, first in states[0].items():
        stacked = np.stack([np.asarray(state[key], dtype=np.float64) for state in states])
        value = np.median(stacked, axis=0)
        value = np.rint(value) if first.dtype.kind in "iub" else value
        median[key] = np.asarray(value).astype(first.dtype)
    return median
