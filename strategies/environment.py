"""What a run gives every strategy besides its own settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import ArrayRecord

from strategies.ground_truth import GroundTruth


@dataclass(frozen=True)
class Environment:
    """num_clients: the federation's size; seed: the run's seed.
    comm_budget: client participations every method spends (None: each strategy's own rounds).
    skip_failed: drop a failed client from its round instead of stopping the run.
    parameter_names: the model's trainable parameters by name (FedDyn corrects only those).
    truth: the simulated scene's ground truth, for detection metrics; None without ground truth.
    new_network: a freshly initialised network of the run's architecture, seeded from the run's seed
        (Co-teaching's second network); None where the server has not given one.
    iid: the scene's partition is IID (FedDiv's regulariser is on only for non-IID data).
    """

    num_clients: int
    seed: int
    comm_budget: int | None = None
    skip_failed: bool = False
    parameter_names: tuple[str, ...] = ()
    truth: GroundTruth | None = None
    ground_truth: bool = False
    new_network: Callable[[], ArrayRecord] | None = None
    iid: bool = True
