"""Helpers shared by strategies: averaging state arrays, sampling clients, round sizes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import Message

from data.errors import ConfigError


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


def round_size(fraction: float, population: int, minimum: int = 1) -> int:
    """Clients per round: max(minimum, round(fraction * population)), at most the population."""
    return min(population, max(minimum, int(round(fraction * population))))


def sample_clients(rng: np.random.Generator, population: Sequence[int], count: int) -> list[int]:
    """``count`` distinct clients drawn uniformly from ``population`` (sorted, for readable logs)."""
    if count > len(population):
        raise ConfigError(f"cannot sample {count} clients from {len(population)}")
    return sorted(int(pid) for pid in rng.choice(np.asarray(population), size=count, replace=False))


def answering_node(reply: Message, sent: Iterable[Message]) -> int:
    """The node a reply answers for: the destination of the message it replies to. The SuperLink
    answers itself (src_node_id 1, "Node Unavailable") for a node that stopped sending heartbeats,
    so the sender is only the fallback. The grid stamps each message's id on it when it pushes it."""
    answered = reply.metadata.reply_to_message_id
    for message in sent:
        if answered and message.metadata.message_id == answered:
            return message.metadata.dst_node_id
    return reply.metadata.src_node_id


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def short_reason(reason: str) -> str:
    """The last line of a client error (its exception), without the Ray traceback and colour codes."""
    lines = [line.strip() for line in _ANSI.sub("", reason).splitlines() if line.strip()]
    return lines[-1] if lines else "(no reason given)"


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
