"""FedAvg (McMahan et al. 2017) on the Message API, sampling clients from the run's seed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from common.errors import ConfigError
from models.peer_pair import is_pair_state
from protocol.messages import TRAIN, TrainIns, instruction
from strategies.aggregation import as_numpy, as_record, peer_pair, weighted_average
from strategies.base import FederatedStrategy, StrategySettings, TrainReply
from strategies.context import StrategyContext
from strategies.rounds import RoundSettings
from strategies.sampling import sample_clients
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

    The base of the round-based strategies, each usable standalone and, unless it has stages of its
    own (``stage3 = False``), as FedCorr's stage 3. The learner's schedule (LSR's gamma_t,
    Co-teaching's forget rate) runs on this strategy's own rounds, from 0. With a learner that trains
    two networks, ``context.new_network`` gives the second one while the global model is one network
    (the start, or FedCorr's stage 3).

    stage: the stage name written in the round log (default: the strategy's name; FedCorr's stage 3
        is "usual").
    """

    name = "fedavg"
    settings: RoundSettings
    learner: ClassVar[str | None] = None
    """The learner the method always trains with (FedLSR's lsr); None: the ``train`` block's."""
    two_networks: ClassVar[bool] = True
    """Whether it works with a learner that trains two networks (Co-teaching)."""
    stage3: ClassVar[bool] = True
    """Whether FedCorr may run it as its stage 3."""
    plugin: ClassVar[str] = ""
    """The client plug-in its clients train with (``""``: plain local training)."""
    budget_sized: ClassVar[frozenset[str] | None] = frozenset({"num_rounds"})

    def __init__(self, settings: RoundSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context)
        self.num_rounds = settings.rounds_under(context.comm_budget, context.num_clients)
        self.train = self.training(settings.train)
        self.stage = stage or self.name
        self.stage_rounds = 0

    @classmethod
    def training(cls, train: LocalTraining) -> LocalTraining:
        """The local training the method's clients do, from the ``train`` block's."""
        return train if cls.learner is None else train.but(learner=cls.learner)

    @classmethod
    def check_learner(cls, train: LocalTraining, key: str) -> None:
        """Refuse a learner the method cannot train with (``key``: where the learner was set)."""
        if cls.learner is not None and train.learner not in ("ce", cls.learner):
            raise ConfigError(f"{key}={train.learner} is invalid: {cls.name} trains with learner {cls.learner}")
        if cls.training(train).peers and not cls.two_networks:
            raise ConfigError(f"{key}={train.learner} is invalid: {cls.name} works with one network; "
                              "a learner that trains two (coteaching) needs another strategy")

    @classmethod
    def check_run(cls, settings: StrategySettings, context: StrategyContext) -> None:
        """The settings' run checks, and a learner the method can train with."""
        super().check_run(settings, context)
        assert isinstance(settings, RoundSettings)
        cls.check_learner(settings.train, "strategy.train.learner")

    def summary(self) -> None:
        """Log the schedule and the local training."""
        log.info("%s: %d rounds, fraction=%s, min_clients=%d, stage=%s, skip_failed=%s, train=%s",
                 type(self).__name__, self.num_rounds, self.settings.fraction, self.settings.min_clients,
                 self.stage, self.skip_failed, self.train)

    def planned_rounds(self) -> int:
        """``num_rounds``."""
        return self.num_rounds

    def node_state(self) -> bool:
        """False: plain local training keeps nothing between rounds (a plug-in that does says True)."""
        return False

    def planned_clients(self, server_round: int) -> int:
        """``round_size``, in every round."""
        return self.round_size()

    def round_size(self) -> int:
        """Clients per round: ``fraction`` of the federation, at least ``min_clients``."""
        return self.settings.round_size(len(self.federation.partition_ids))

    def select(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> list[int]:
        """The clients that train this round: a fresh uniform sample of those taking part (all of
        them when fewer take part than a round's size)."""
        present = self.present(server_round)
        return sample_clients(self.rng, present, min(self.round_size(), len(present)))

    def train_instruction(self, server_round: int) -> TrainIns:
        """What this round's clients are told to do (subclasses change the training or the plug-in):
        the local training and the learner's values for this strategy's round."""
        return TrainIns(server_round=server_round, training=self.train, plugin=self.plugin,
                        schedule=self.train.schedule_at(self.stage_rounds))

    def starting_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The arrays clients start from: ``arrays``, as a pair with a fresh second network when the
        learner trains two networks and ``arrays`` hold one."""
        if not self.train.peers or is_pair_state(arrays.keys()):
            return arrays
        if self.context.new_network is None:
            raise ConfigError(f"learner={self.train.learner} trains two networks; the server gave no way "
                              "to initialise the second one")
        return peer_pair(arrays, self.context.new_network())

    def plugin_ins(self, pid: int) -> object | None:
        """Client ``pid``'s plug-in instruction sent beside the train instruction (None: none)."""
        return None

    def plugin_arrays(self, pid: int) -> ArrayRecord | None:
        """Client ``pid``'s plug-in arrays sent beside the global arrays (None: none)."""
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
        return self.messages({pid: instruction(ins, arrays=arrays, plugin_ins=self.plugin_ins(pid),
                                               plugin_arrays=self.plugin_arrays(pid), plugin=ins.plugin)
                              for pid in chosen}, TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new global arrays from the good replies, and their size-weighted mean train loss."""
        good = self.collect(replies, self.read_train)
        arrays, train_loss = self.aggregate(good), mean_train_loss(good)
        self.stage_rounds += 1
        self.record_round(server_round, self.stage, list(good), train_loss, arrays)
        return arrays, MetricRecord({"train-loss": train_loss})
