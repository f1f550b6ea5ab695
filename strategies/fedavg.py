"""FedAvg (McMahan et al. 2017) on the Message API, sampling clients from the run's seed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from common.errors import ConfigError
from models.peer_pair import is_pair_state
from protocol.messages import TRAIN, TrainIns, instruction
from strategies.aggregation import as_numpy, as_record, peer_pair, weighted_average
from strategies.base import FederatedStrategy, TrainReply
from strategies.registry import RoundMethod, round_entry
from strategies.sampling import round_size, sample_clients
from task.local_training import LocalTraining

log = logging.getLogger(__name__)


def client_states(replies: dict[int, TrainReply]) -> list[dict[str, np.ndarray]]:
    """Every reply's arrays as NumPy, in partition order."""
    return [as_numpy(reply.arrays) for reply in replies.values()]


def example_counts(replies: dict[int, TrainReply]) -> list[float]:
    """Every reply's local set size (its ``num-examples``), in partition order."""
    return [float(reply.result.num_examples) for reply in replies.values()]


def mean_train_loss(replies: dict[int, TrainReply]) -> float:
    """The clients' train losses averaged weighted by their local set sizes, over the clients that
    trained (a client with nothing to train on, as FedDiv's can be, reports NaN); NaN if none did."""
    losses = np.array([reply.result.train_loss for reply in replies.values()])
    trained = np.isfinite(losses)
    if not trained.any():
        return float("nan")
    return float(np.average(losses[trained], weights=np.array(example_counts(replies))[trained]))


def average_arrays(replies: dict[int, TrainReply]) -> ArrayRecord:
    """The clients' arrays averaged weighted by their ``num-examples``."""
    return as_record(weighted_average(client_states(replies), example_counts(replies)))


class FedAvg(FederatedStrategy):
    """Each round, a fresh uniform sample of clients trains from the global model; the server
    averages all their state arrays (parameters and BatchNorm buffers) weighted by local set size.

    num_rounds: rounds to run.
    fraction: share of all clients sampled per round (at least ``min_clients``).
    min_clients: the smallest round size.
    train: the local SGD settings clients train with (and their learner). The learner's schedule
        (LSR's gamma_t, Co-teaching's forget rate) runs on this strategy's own rounds, from 0.
    stage: the stage name written in the round log (FedCorr's stage 3 is "usual").
    new_network: a fresh, seeded network for the learner's second network when it trains two
        (Co-teaching) and the global model is still one network (the start, or FedCorr's stage 3).
    rng, skip_failed: see ``FederatedStrategy``.
    """

    def __init__(
        self,
        *,
        num_rounds: int,
        fraction: float,
        train: LocalTraining,
        min_clients: int = 1,
        stage: str = "fedavg",
        new_network: Callable[[], ArrayRecord] | None = None,
        rng: np.random.Generator,
        skip_failed: bool = False,
    ) -> None:
        super().__init__(rng=rng, skip_failed=skip_failed)
        self.num_rounds = num_rounds
        self.fraction = fraction
        self.min_clients = min_clients
        self.train = train
        self.stage = stage
        self.new_network = new_network
        self.stage_rounds = 0

    def summary(self) -> None:
        """Log the schedule and the local training."""
        log.info("%s: %d rounds, fraction=%s, min_clients=%d, stage=%s, skip_failed=%s, train=%s",
                 type(self).__name__, self.num_rounds, self.fraction, self.min_clients, self.stage,
                 self.skip_failed, self.train)

    def planned_rounds(self) -> int:
        """``num_rounds``."""
        return self.num_rounds

    def round_size(self) -> int:
        """Clients per round: ``fraction`` of the federation, at least ``min_clients``."""
        return round_size(self.fraction, len(self.federation.partition_ids), self.min_clients)

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        """The clients that train this round: a fresh uniform sample."""
        return sample_clients(self.rng, self.federation.partition_ids, self.round_size())

    def train_instruction(self, server_round: int) -> TrainIns:
        """What this round's clients are told to do (subclasses change the training or the method):
        the local training and the learner's values for this strategy's round."""
        return TrainIns(server_round=server_round, training=self.train,
                        schedule=self.train.schedule_at(self.stage_rounds))

    def starting_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The arrays clients start from: ``arrays``, as a pair with a fresh second network when the
        learner trains two networks and ``arrays`` hold one."""
        if not self.train.peers or is_pair_state(arrays.keys()):
            return arrays
        if self.new_network is None:
            raise ConfigError(f"learner={self.train.learner} trains two networks; the server gave no way "
                              "to initialise the second one")
        return peer_pair(arrays, self.new_network())

    def train_options(self) -> Any:
        """The client plug-in's options sent with the instruction (None: none)."""
        return None

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """The new global arrays from this round's replies."""
        return average_arrays(replies)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send this round's sample the global arrays and its train instruction."""
        arrays = self.starting_arrays(arrays)
        self.global_arrays = arrays
        chosen = self.select(server_round, arrays, grid)
        ins = self.train_instruction(server_round)
        content = instruction(ins, arrays=arrays, options=self.train_options(), method=ins.method)
        return self.messages({pid: content for pid in chosen}, TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new global arrays from the good replies, and their size-weighted mean train loss."""
        good = self.collect(replies, self.read_train)
        arrays, train_loss = self.aggregate(good), mean_train_loss(good)
        self.stage_rounds += 1
        self.record_round(server_round, self.stage, list(good), train_loss, arrays)
        return arrays, MetricRecord({"train-loss": train_loss})


@dataclass(frozen=True)
class NoOptions:
    """A round-based method without options of its own."""


STRATEGY = round_entry("fedavg", RoundMethod(NoOptions, FedAvg))
