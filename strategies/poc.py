"""Power-of-Choice client selection (Cho et al. 2020), on FedAvg's aggregation.

Each round the server draws a candidate pool of d clients without replacement, with probability
proportional to their local set sizes; every candidate answers ``query.loss`` with the global
model's loss on its local data, and the m = round(fraction * N) candidates with the highest loss
train. The loss queries are forward passes, not training participations: they are counted apart
from the communication cost (results.json block ``poc``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid

from common.errors import ConfigError
from common.validation import Integer, check_fields, rule
from protocol.messages import LOSS, Scores, instruction, read_reply
from strategies.environment import Environment
from strategies.fedavg import FedAvg
from strategies.registry import RoundMethod, round_entry


@dataclass(frozen=True)
class PocOptions:
    """d: the candidate pool size (FedCorr Appendix B: 30 of 100 clients); round size <= d <= N."""

    d: int = field(metadata=rule(Integer(low=1)))

    def __post_init__(self) -> None:
        check_fields(self)


def check_pool(options: PocOptions, round_clients: int, env: Environment, key: str) -> None:
    """The pool must hold a round's clients and fit the federation."""
    if not round_clients <= options.d <= env.num_clients:
        raise ConfigError(
            f"{key}.d={options.d} is invalid: allowed is between the clients per round ({round_clients}) "
            f"and num_clients ({env.num_clients})"
        )


def highest_loss(losses: dict[int, float], count: int) -> list[int]:
    """The ``count`` clients with the highest loss (ties: the lower partition id), sorted by id."""
    ranked = sorted(losses, key=lambda pid: (-losses[pid], pid))
    return sorted(ranked[:count])


def _read_loss(content: RecordDict, sender: str) -> float:
    return read_reply(content, Scores, sender).loss


class PowerOfChoice(FedAvg):
    """FedAvg whose clients are the highest-loss members of a random candidate pool.

    d: candidate pool size; m <= d <= N (checked with the config).
    Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, d: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.d = d
        self.loss_queries = 0

    def candidates(self) -> list[int]:
        """The round's pool: ``d`` distinct clients drawn with probability proportional to local set size."""
        population = self.federation.partition_ids
        sizes = np.array([self.federation.num_examples[pid] for pid in population], dtype=np.float64)
        chosen = self.rng.choice(np.asarray(population), size=self.d, replace=False, p=sizes / sizes.sum())
        return sorted(int(pid) for pid in chosen)

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        """The clients that train this round: the pool's highest losses under the global model."""
        pool = self.candidates()
        query = instruction(arrays=arrays)
        losses = self.exchange(grid, {pid: query for pid in pool}, LOSS, _read_loss)
        self.loss_queries += len(losses)
        return highest_loss(losses, min(self.round_size(), len(losses)))

    def extra_results(self) -> dict[str, Any]:
        """The ``poc`` block of results.json: ``d`` and how many loss queries clients answered."""
        return {"poc": {"d": self.d, "loss_queries": self.loss_queries}}


STRATEGY = round_entry("poc", RoundMethod(PocOptions, PowerOfChoice, check=check_pool))
