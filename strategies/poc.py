"""Power-of-Choice client selection (Cho et al. 2020), on FedAvg's aggregation.

Each round the server draws a candidate pool of d clients without replacement, with probability
proportional to their local set sizes; every candidate answers ``query.loss`` with the global
model's loss on its local data, and the m = round(fraction * N) candidates with the highest loss
train. The loss queries are forward passes, not training participations: they are counted apart
from the communication cost (results.json block ``poc``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from strategies.fedavg import FedAvg

LOSS_QUERY = f"{MessageType.QUERY}.loss"


def highest_loss(losses: dict[int, float], count: int) -> list[int]:
    """The ``count`` clients with the highest loss (ties: the lower partition id), sorted by id."""
    ranked = sorted(losses, key=lambda pid: (-losses[pid], pid))
    return sorted(ranked[:count])


class PowerOfChoice(FedAvg):
    """FedAvg whose clients are the highest-loss members of a random candidate pool.

    d: candidate pool size (FedCorr Appendix B: 30 of 100 clients); m <= d <= N (the registry checks it).
    timeout: seconds the loss query waits for the candidates' replies.
    Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, d: int, timeout: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.d = d
        self.timeout = timeout
        self.loss_queries = 0

    def candidates(self) -> list[int]:
        population = self.federation.partition_ids
        sizes = np.array([self.federation.num_examples[pid] for pid in population], dtype=np.float64)
        chosen = self.rng.choice(np.asarray(population), size=self.d, replace=False, p=sizes / sizes.sum())
        return sorted(int(pid) for pid in chosen)

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        pool = self.candidates()
        query = RecordDict({"arrays": arrays})
        replies = self.exchange(grid, {pid: query for pid in pool}, LOSS_QUERY, self.timeout)
        self.loss_queries += len(replies)
        losses = {pid: float(content["metrics"]["loss"]) for pid, content in replies.items()}
        return highest_loss(losses, min(self.round_size(), len(losses)))

    def extra_results(self) -> dict[str, Any]:
        return {"poc": {"d": self.d, "loss_queries": self.loss_queries}}
