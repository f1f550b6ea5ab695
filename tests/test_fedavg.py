"""FedAvg as the round-based strategies build on it: the summary line a run logs, the learner checks'
one-line errors, the arrays a round starts from, what each sampled client is told, and the mean train
loss of a round, each against values worked out by hand."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
from defaults import context, coteaching_settings, local_training, lsr_settings, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata

from common.errors import ConfigError
from protocol.messages import TRAIN, TrainIns, TrainStats, read_instruction, read_plugin_arrays, read_plugin_ins, reply
from strategies.base import TrainReply
from strategies.fedavg import FedAvg, mean_train_loss
from strategies.federation import Federation
from strategies.fedlsr import FedLSR
from strategies.scaffold import Scaffold
from task.learner_settings import LearnerSchedule

pytestmark = pytest.mark.usefixtures("flower_identity")

NODES = {0: 9_001, 1: 4_242, 2: 77, 3: 123_456}
ONE = ArrayRecord({"w": Array(np.array([1.0, 2.0], np.float32))})
SECOND = ArrayRecord({"w": Array(np.array([5.0, 6.0], np.float32))})
COTEACHING = local_training(learner="coteaching", coteaching=coteaching_settings(forget_rate=0.2))


def bound(strategy: FedAvg) -> FedAvg:
    """``strategy`` bound to four partitions of 10, 30, 20 and 40 samples."""
    strategy.bind(Federation(node_of=dict(NODES), num_examples={0: 10, 1: 30, 2: 20, 3: 40}))
    return strategy


def partition_of(message: Message) -> int:
    """The partition a message is addressed to."""
    return {node: pid for pid, node in NODES.items()}[message.metadata.dst_node_id]


def answer(message: Message, loss: float) -> Message:
    """The addressed client's train reply to ``message``: its arrays back, 10 examples and ``loss``."""
    metadata = Metadata(run_id=1, message_id="", src_node_id=message.metadata.dst_node_id, dst_node_id=0,
                        reply_to_message_id="", group_id="", created_at=0.0, ttl=60.0, message_type=TRAIN)
    arrays = message.content["arrays"]
    return Message(content=reply(TrainStats(num_examples=10, train_loss=loss, steps=1), arrays=arrays),
                   metadata=metadata)


def train_reply(n: int, loss: float) -> TrainReply:
    """A checked reply of a client with ``n`` examples and train loss ``loss``."""
    return TrainReply(ONE, TrainStats(num_examples=n, train_loss=loss, steps=1))


# --- the summary line ------------------------------------------------------------------------------

def test_the_summary_line_names_the_class_rounds_round_size_stage_policy_and_training(caplog):
    """What a user reads at the start of a run: every value of the schedule, in this order."""
    train = local_training(lr=0.05)
    settings = strategy_settings("fedavg", num_rounds=7, fraction=0.25, min_clients=3, train=train)
    strategy = FedAvg(settings, context(skip_failed=True), stage="usual")
    with caplog.at_level(logging.INFO, logger="strategies.fedavg"):
        strategy.summary()
    lines = [record.getMessage() for record in caplog.records if record.name == "strategies.fedavg"]
    assert lines == [f"FedAvg: 7 rounds, fraction=0.25, min_clients=3, stage=usual, skip_failed=True, train={train}"]


def test_the_summary_names_the_subclass_and_its_own_stage_by_default(caplog):
    """A subclass's line names that class, and its stage is its name when none is given."""
    strategy = FedLSR(strategy_settings("fedlsr", num_rounds=2, fraction=0.5, min_clients=1), context())
    with caplog.at_level(logging.INFO, logger="strategies.fedavg"):
        strategy.summary()
    assert caplog.records[-1].getMessage().startswith(
        "FedLSR: 2 rounds, fraction=0.5, min_clients=1, stage=fedlsr, skip_failed=False, train=")


# --- the mean train loss ---------------------------------------------------------------------------

def test_the_mean_train_loss_weights_by_set_size_over_the_clients_that_trained():
    """(10 * 1.0 + 30 * 4.0) / 40 = 3.25: the NaN of a client that trained nothing (50 examples) is left
    out with its weight; a round where no client trained has a NaN loss (no number to stand in)."""
    assert mean_train_loss({0: train_reply(10, 1.0), 1: train_reply(50, math.nan), 2: train_reply(30, 4.0)}) == 3.25
    nothing = mean_train_loss({0: train_reply(10, math.nan), 1: train_reply(20, math.nan)})
    assert isinstance(nothing, float) and math.isnan(nothing)


# --- the learner checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("learner", ["ce", "lsr", "sce", "mixup", "coteaching"])
def test_fedavg_trains_with_whatever_learner_the_train_block_names(learner):
    """FedAvg has no learner of its own and works with two networks: no learner is refused, and its
    clients train with the block's learner as it is."""
    train = local_training(learner=learner, coteaching=coteaching_settings(forget_rate=0.2), mixup_alpha=0.5)
    FedAvg.check_learner(train, "strategy.train.learner")
    assert FedAvg.training(train) == train


@pytest.mark.parametrize("learner", ["ce", "lsr"])
def test_fedlsr_takes_ce_or_lsr_and_always_trains_with_lsr(learner):
    """The block may say ce (the default) or lsr; FedLSR's clients train with lsr either way."""
    train = local_training(learner=learner)
    FedLSR.check_learner(train, "strategy.train.learner")
    assert FedLSR.training(train) == local_training(learner="lsr")
    strategy = FedLSR(strategy_settings("fedlsr", train=train), context())
    assert strategy.train.learner == "lsr" and strategy.train == local_training(learner="lsr")


def test_fedlsr_refuses_another_learner_in_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^stage3_learner=sce is invalid: fedlsr trains with learner lsr$"):
        FedLSR.check_learner(local_training(learner="sce"), "stage3_learner")


def test_a_one_network_strategy_refuses_coteaching_in_one_line_naming_the_key():
    message = ("strategy.train.learner=coteaching is invalid: scaffold works with one network; "
               "a learner that trains two (coteaching) needs another strategy")
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Scaffold.check_learner(COTEACHING, "strategy.train.learner")


def test_the_run_check_refuses_the_learner_under_the_strategy_blocks_key():
    """check_run names where the learner was set: ``strategy.train.learner``."""
    settings = strategy_settings("fedlsr", train=local_training(learner="sce"))
    with pytest.raises(ConfigError, match=r"^strategy.train.learner=sce is invalid: fedlsr trains with learner lsr$"):
        FedLSR.check_run(settings, context())
    FedLSR.check_run(strategy_settings("fedlsr"), context())  # the preset's lsr passes


# --- the arrays a round starts from ----------------------------------------------------------------

def coteaching_fedavg(new_network=lambda: SECOND) -> FedAvg:
    settings = strategy_settings("fedavg", num_rounds=3, fraction=0.5, train=COTEACHING)
    return bound(FedAvg(settings, context(new_network=new_network)))


def test_one_network_starts_a_two_network_learner_as_a_pair_with_a_fresh_second():
    """Co-teaching's clients get the global network as ``first`` and the server's new network as
    ``second``; the pair is what the round's global arrays are."""
    strategy = coteaching_fedavg()
    messages = list(strategy.configure_train(1, ONE, ConfigRecord(), grid=None))
    assert len(messages) == 2
    for message in messages:
        sent = message.content["arrays"]
        assert list(sent.keys()) == ["first.w", "second.w"]
        assert sent["first.w"].numpy().tolist() == [1.0, 2.0] and sent["second.w"].numpy().tolist() == [5.0, 6.0]
    assert strategy.global_arrays is not None and list(strategy.global_arrays.keys()) == ["first.w", "second.w"]


def test_a_pair_is_sent_as_it_is_and_no_new_network_is_made():
    def no_new_network() -> ArrayRecord:
        raise AssertionError("a pair needs no second network")

    pair = ArrayRecord({"first.w": Array(np.array([1.0], np.float32)), "second.w": Array(np.array([3.0], np.float32))})
    strategy = coteaching_fedavg(no_new_network)
    assert strategy.starting_arrays(pair) is pair


def test_a_two_network_learner_without_a_way_to_make_the_second_network_is_one_clear_error():
    message = "learner=coteaching trains two networks; the server gave no way to initialise the second one"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        coteaching_fedavg(None).starting_arrays(ONE)


def test_a_one_network_learner_starts_from_the_arrays_as_they_are():
    strategy = bound(FedAvg(strategy_settings("fedavg", train=local_training()), context(new_network=lambda: SECOND)))
    assert strategy.starting_arrays(ONE) is ONE


# --- what each sampled client is told --------------------------------------------------------------

def test_each_round_tells_the_clients_the_learners_value_for_the_strategys_own_round():
    """LSR's gamma_t = gamma * t / t_w in the warm-up, t counted from the strategy's first round:
    with gamma 0.4 and t_w 4 the clients get 0.0 in round 1 and 0.1 in round 2."""
    train = local_training(learner="lsr", lsr=lsr_settings(gamma=0.4, warmup_rounds=4))
    strategy = bound(FedLSR(strategy_settings("fedlsr", num_rounds=3, fraction=0.5, train=train), context()))
    first = list(strategy.configure_train(1, ONE, ConfigRecord(), grid=None))
    assert {read_instruction(m.content, TrainIns) for m in first} == {
        TrainIns(1, train, "", LearnerSchedule(distill_weight=0.0))}
    strategy.aggregate_train(1, [answer(m, 0.5) for m in first])
    second = list(strategy.configure_train(2, ONE, ConfigRecord(), grid=None))
    assert {read_instruction(m.content, TrainIns) for m in second} == {
        TrainIns(2, train, "", LearnerSchedule(distill_weight=0.1))}


@dataclass(frozen=True)
class ProbeIns:
    """A plug-in instruction that names the client it was made for."""

    pid: int


class Probe(FedAvg):
    """FedAvg whose plug-in instruction and arrays differ per client, and which notes the round its
    selection was asked for."""

    plugin = "probe"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.selected_for: list[int] = []

    def select(self, server_round, arrays, grid):
        self.selected_for.append(server_round)
        return super().select(server_round, arrays, grid)

    def plugin_ins(self, pid: int) -> ProbeIns:
        return ProbeIns(pid=pid)

    def plugin_arrays(self, pid: int) -> ArrayRecord:
        return ArrayRecord({"c": Array(np.array([float(pid)], np.float32))})


def test_each_sampled_client_gets_its_own_plugin_instruction_and_arrays_beside_the_global_arrays():
    """A subclass's per-client hooks are asked for that client (FedNoRo's role, SCAFFOLD's control
    variate), and its selection for the round being configured."""
    strategy = bound(Probe(strategy_settings("fedavg", num_rounds=3, fraction=0.5), context()))
    messages = list(strategy.configure_train(3, ONE, ConfigRecord(), grid=None))
    assert strategy.selected_for == [3] and len(messages) == 2
    for message in messages:
        pid = partition_of(message)
        assert read_plugin_ins(message.content, "probe", ProbeIns) == ProbeIns(pid)
        assert read_plugin_arrays(message.content, "probe", "the server")["c"].numpy().tolist() == [float(pid)]
        assert read_instruction(message.content, TrainIns).plugin == "probe"
        assert message.content["arrays"]["w"].numpy().tolist() == [1.0, 2.0]


def test_a_plain_fedavg_instruction_carries_no_plugin_records():
    strategy = bound(FedAvg(strategy_settings("fedavg", num_rounds=3, fraction=0.5), context()))
    for message in strategy.configure_train(1, ONE, ConfigRecord(), grid=None):
        assert set(message.content.keys()) == {"arrays", "config"}
