"""Power-of-Choice client selection (Cho et al. 2020), on FedAvg's aggregation.

Each round the server draws a candidate pool of d clients without replacement, with probability
proportional to their local set sizes; every candidate answers ``query.loss`` with the global
model's loss on its local data, and the m = round(fraction * N) candidates with the highest loss
train. The loss queries are forward passes, not training participations: they are counted apart
from the communication cost (results.json block ``poc``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid

from common.errors import InvalidValue
from common.validation import Interval, option
from protocol.messages import LOSS, Scores, instruction, read_reply
from strategies.context import StrategyContext
from strategies.fedavg import FedAvg
from strategies.rounds import RoundSettings


@dataclass(frozen=True)
class PocSettings(RoundSettings):
    """FedAvg's schedule and the candidate pool (``conf/strategy/options/poc.yaml``)."""

    d: int = option(Interval(int, 1), "the candidate pool size; round size <= d <= num_clients "
                                      "(FedCorr Appendix B: 30 of 100 clients)")

    def check_options(self, context: StrategyContext) -> None:
        """The pool must hold a round's clients and fit the federation."""
        round_clients = self.round_size(context.num_clients)
        if not round_clients <= self.d <= context.num_clients:
            raise InvalidValue("d", self.d, f"allowed is between the clients per round ({round_clients}) "
                                            f"and num_clients ({context.num_clients})")


def highest_loss(losses: dict[int, float], count: int) -> list[int]:
    """The ``count`` clients with the highest loss (ties: the lower partition id), sorted by id."""
    ranked = sorted(losses, key=lambda pid: (-losses[pid], pid))
    return sorted(ranked[:count])


def _read_loss(content: RecordDict, sender: str) -> float:
    return read_reply(content, Scores, sender).loss


class PowerOfChoice(FedAvg):
    """FedAvg whose clients are the highest-loss members of a random candidate pool of ``d``."""

    name = "poc"
    settings: PocSettings

    def __init__(self, settings: PocSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage)
        self.loss_queries = 0

    def candidates(self, server_round: int) -> list[int]:
        """The round's pool: ``d`` distinct clients of those taking part, drawn with probability
        proportional to local set size (all of them when fewer than ``d`` take part)."""
        population = self.present(server_round)
        sizes = np.array([self.federation.num_examples[pid] for pid in population], dtype=np.float64)
        chosen = self.rng.choice(np.asarray(population), size=min(self.settings.d, len(population)), replace=False,
                                 p=sizes / sizes.sum())
        return sorted(int(pid) for pid in chosen)

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        """The clients that train this round: the pool's highest losses under the global model."""
        pool = self.candidates(server_round)
        query = instruction(arrays=arrays)
        losses = self.exchange(grid, {pid: query for pid in pool}, LOSS, _read_loss)
        self.loss_queries += len(losses)
        return highest_loss(losses, min(self.round_size(), len(losses)))

    def result_blocks(self) -> dict[str, Any]:
        """The ``poc`` block of results.json: ``d`` and how many loss queries clients answered."""
        return {"poc": {"d": self.settings.d, "loss_queries": self.loss_queries}}
