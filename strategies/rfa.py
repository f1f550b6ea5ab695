"""RFA, robust federated aggregation (Pillutla, Kakade and Harchaoui, IEEE TSP 2022): the new global
model is the geometric median of the clients' models, weighted by local set size.

The median minimises sum_i alpha_i ||v - w_i|| (alpha_i = n_i / sum n, w_i: client i's model as one
vector of its floating-point arrays). The smoothed Weiszfeld algorithm finds it: from the weighted
mean v, repeat beta_i = alpha_i / max(nu, ||v - w_i||), v <- sum_i beta_i w_i / sum_i beta_i, for at
most ``max_iterations`` steps, stopping early once the objective improves by less than
``tolerance`` times its value. Integer buffers (BatchNorm's batch counts) are averaged. Each step is
a weighted average, the operation secure aggregation offers, which is why RFA keeps client updates
as private as FedAvg does. ``docs/rfa.md`` maps the method to this code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from common.validation import Interval, option
from strategies.aggregation import as_record, weighted_average
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.fedavg import FedAvg, client_states, example_counts
from strategies.rounds import RoundSettings


@dataclass(frozen=True)
class RfaSettings(RoundSettings):
    """FedAvg's schedule and the smoothed Weiszfeld algorithm's settings (``conf/strategy/options/rfa.yaml``)."""

    smoothing: float = option(Interval(float, 0.0, closed="neither"),
                              "nu: distances below it count as nu, so a client at the median cannot divide by 0")
    max_iterations: int = option(Interval(int, 1), "Weiszfeld steps per round at most (each one weighted average)")
    tolerance: float = option(Interval(float, 0.0), "stop once the objective improves by less than this share of it")


@dataclass(frozen=True)
class GeometricMedian:
    """A smoothed Weiszfeld solution: the median, the steps taken and the objective after each."""

    median: np.ndarray
    iterations: int
    objectives: list[float]


def weiszfeld(points: np.ndarray, weights: Sequence[float], smoothing: float, max_iterations: int,
              tolerance: float) -> GeometricMedian:
    """The weighted geometric median of the rows of ``points`` by the smoothed Weiszfeld algorithm,
    started from the weighted mean. Weights that do not sum to a positive number are refused (every
    client of a round reporting no examples), as FedAvg's average refuses them."""
    total = float(np.sum(weights))
    if not total > 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    alpha = np.asarray(weights, dtype=np.float64) / total
    median = alpha @ points

    def objective(v: np.ndarray) -> float:
        return float(alpha @ np.linalg.norm(points - v, axis=1))

    objectives = [objective(median)]
    iterations = 0
    while iterations < max_iterations:
        beta = alpha / np.maximum(smoothing, np.linalg.norm(points - median, axis=1))
        median = (beta / beta.sum()) @ points
        iterations += 1
        objectives.append(objective(median))
        if abs(objectives[-2] - objectives[-1]) < tolerance * objectives[-1]:
            break
    return GeometricMedian(median, iterations, objectives)


def geometric_median_state(states: Sequence[dict[str, np.ndarray]], weights: Sequence[float], smoothing: float,
                           max_iterations: int, tolerance: float) -> tuple[dict[str, np.ndarray], GeometricMedian]:
    """The geometric median of model states over their floating-point arrays taken as one vector;
    the other arrays (integer buffers) are averaged. Each array keeps its dtype."""
    floats = [key for key, value in states[0].items() if np.asarray(value).dtype.kind == "f"]
    points = np.stack([np.concatenate([np.asarray(state[key], dtype=np.float64).ravel() for key in floats])
                       for state in states])
    solution = weiszfeld(points, weights, smoothing, max_iterations, tolerance)
    others = [{key: value for key, value in state.items() if key not in floats} for state in states]
    result = weighted_average(others, weights) if others[0] else {}
    offset = 0
    for key in floats:
        reference = np.asarray(states[0][key])
        result[key] = solution.median[offset:offset + reference.size].reshape(reference.shape).astype(reference.dtype)
        offset += reference.size
    return {key: result[key] for key in states[0]}, solution


class Rfa(FedAvg):
    """FedAvg's sampling with the weighted geometric median in place of the weighted mean."""

    name = "rfa"
    settings: RfaSettings

    def __init__(self, settings: RfaSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage)
        self.iterations: list[int] = []

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """The geometric median of the round's models, weighted by local set size."""
        s = self.settings
        state, solution = geometric_median_state(client_states(replies), example_counts(replies), s.smoothing,
                                                 s.max_iterations, s.tolerance)
        self.iterations.append(solution.iterations)
        return as_record(state)

    def result_blocks(self) -> dict[str, Any]:
        """The ``rfa`` block: the Weiszfeld steps each round took."""
        mean = float(np.mean(self.iterations)) if self.iterations else None
        return {"rfa": {"weiszfeld_iterations": self.iterations, "mean_iterations": mean}}
