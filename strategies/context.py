"""What a run gives every strategy besides its own settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from flwr.app import ArrayRecord

from strategies.ground_truth import GroundTruth
from strategies.participation import Participation


@dataclass(frozen=True)
class StrategyContext:
    """A strategy's view of its run. The first group is known as soon as the config is checked (what a
    strategy's ``check_run`` may use); the second once the server runs.

    num_clients: the federation's size; seed: the run's seed.
    comm_budget: the client participations this strategy may spend (None: its own rounds).
    skip_failed: drop a failed client from its round instead of stopping the run.
    participation: which clients take part from which round (the late joiners).
    ground_truth: whether the run may read the scene's ground truth.
    iid: the scene's partition is IID (FedDiv's regulariser is on only for non-IID data).
    rng: the generator every client-sampling decision draws from (shared by nested strategies).
    parameter_names: the model's trainable parameters by name (FedDyn corrects only those).
    truth: the simulated scene's ground truth; None without it.
    new_network: a freshly initialised network of the run's architecture, seeded from the run's seed
        (Co-teaching's second network); None where the server has not given one.
    """

    num_clients: int
    seed: int
    rng: np.random.Generator
    comm_budget: int | None = None
    skip_failed: bool = False
    participation: Participation = Participation()
    ground_truth: bool = False
    iid: bool = True
    parameter_names: tuple[str, ...] = ()
    truth: GroundTruth | None = None
    new_network: Callable[[], ArrayRecord] | None = None

    def unbudgeted(self) -> StrategyContext:
        """The context of a nested strategy whose rounds its parent sets in its settings (FedCorr's
        stage 3, given what the budget leaves): no budget of its own, the same generator, so draws
        run on."""
        return replace(self, comm_budget=None)
