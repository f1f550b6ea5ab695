"""FedAvg (McMahan et al. 2017) on the Message API, sampling clients from the run's seed."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from strategies.base import FederatedStrategy, RoundInfo
from strategies.utils import round_size, sample_clients, weighted_average

log = logging.getLogger(__name__)


def client_states(replies: dict[int, RecordDict]) -> list[dict[str, np.ndarray]]:
    """Every reply's arrays as NumPy, in partition order."""
    return [{key: array.numpy() for key, array in content["arrays"].items()} for content in replies.values()]


def example_counts(replies: dict[int, RecordDict]) -> list[float]:
    return [float(content["metrics"]["num-examples"]) for content in replies.values()]


def mean_train_loss(replies: dict[int, RecordDict]) -> float:
    """The clients' train losses averaged weighted by their local set sizes."""
    losses = [float(content["metrics"]["train_loss"]) for content in replies.values()]
    return float(np.average(losses, weights=example_counts(replies)))


def to_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(value) for key, value in state.items()})


def average_arrays(replies: dict[int, RecordDict]) -> ArrayRecord:
    """The clients' arrays averaged weighted by their ``num-examples``."""
    return to_record(weighted_average(client_states(replies), example_counts(replies)))


def average_replies(replies: dict[int, RecordDict]) -> tuple[ArrayRecord, float]:
    """The weighted average of the clients' arrays, and their mean train loss."""
    return average_arrays(replies), mean_train_loss(replies)


class FedAvg(FederatedStrategy):
    """Each round, a fresh uniform sample of clients trains from the global model; the server
    averages all their state arrays (parameters and BatchNorm buffers) weighted by local set size.

    num_rounds: rounds to run.
    fraction: share of all clients sampled per round (at least ``min_clients``).
    min_clients: the smallest round size.
    stage: the stage name written in the round log (FedCorr's stage 3 is "usual").
    rng, on_client_error, history: see ``FederatedStrategy``.
    """

    def __init__(
        self,
        *,
        num_rounds: int,
        fraction: float,
        min_clients: int = 1,
        stage: str = "fedavg",
        rng: np.random.Generator,
        on_client_error: str = "fail",
        history: list[RoundInfo] | None = None,
    ) -> None:
        super().__init__(rng=rng, on_client_error=on_client_error, history=history)
        self.num_rounds = num_rounds
        self.fraction = fraction
        self.min_clients = min_clients
        self.stage = stage
        self.global_arrays: ArrayRecord | None = None  # what this round's clients started from

    def summary(self) -> None:
        log.info("%s: fraction=%s, min_clients=%s, on_client_error=%s",
                 type(self).__name__, self.fraction, self.min_clients, self.on_client_error)

    def planned_rounds(self) -> int:
        return self.num_rounds

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        """The clients that train this round: a fresh uniform sample."""
        population = self.federation.partition_ids
        return sample_clients(self.rng, population, self.round_size())

    def round_size(self) -> int:
        return round_size(self.fraction, len(self.federation.partition_ids), self.min_clients)

    def train_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The config sent with this round's train messages (subclasses add their own keys)."""
        return ConfigRecord({**dict(config), "server-round": server_round})

    def aggregate(self, replies: dict[int, RecordDict]) -> ArrayRecord:
        """The new global arrays from this round's replies."""
        return average_arrays(replies)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = arrays
        chosen = self.select(server_round, arrays, grid)
        content = RecordDict({"arrays": arrays, "config": self.train_config(server_round, config)})
        return self.messages({pid: content for pid in chosen}, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.collect_replies(replies)
        arrays, train_loss = self.aggregate(good), mean_train_loss(good)
        self.record_round(server_round, self.stage, list(good), train_loss)
        return arrays, MetricRecord({"train_loss": train_loss})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # The global model is evaluated centrally on the test split (server.evaluate_fn).
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
