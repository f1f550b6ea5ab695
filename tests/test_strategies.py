"""The strategies' shared machinery: aggregation, seeded sampling, addressing, and the checks every
reply passes (failure policy and protocol) before it is aggregated."""

import logging

import numpy as np
import pytest
import torch
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord, RecordDict

from common.errors import ConfigError
from protocol.messages import CONFIG, TrainIns, TrainStats, read_instruction, reply
from server.config import load_run
from server.discovery import discover
from settings.compose import compose_config
from strategies.aggregation import average_buffers, coordinate_median, peer_pair, weighted_average
from strategies.base import ClientFailure
from strategies.fedavg import FedAvg
from strategies.federation import Federation
from strategies.replies import answering_node, short_reason
from strategies.sampling import round_size, sample_clients

pytestmark = pytest.mark.usefixtures("flower_identity")


# Flower node ids are random 64-bit numbers; partitions are 0..N-1.
NODES = {0: 9_001, 1: 4_242, 2: 77, 3: 123_456}
TRAINING = local_training(lr=0.1)
MODEL = ArrayRecord({"w": Array(np.zeros(2, np.float32)), "bn.num_batches_tracked": Array(np.array(0))})


def federation() -> Federation:
    return Federation(node_of=dict(NODES), num_examples={0: 10, 1: 30, 2: 20, 3: 40})


def reply_from(pid: int, content: RecordDict | None = None, error: str | None = None) -> Message:
    metadata = Metadata(run_id=1, message_id="", src_node_id=NODES[pid], dst_node_id=0, reply_to_message_id="",
                        group_id="", created_at=0.0, ttl=60.0, message_type="train")
    if error is not None:
        return Message(error=Error(code=0, reason=error), metadata=metadata)
    return Message(content=content, metadata=metadata)


def train_reply(pid: int, weight: np.ndarray, batches: int, n: int, loss: float) -> Message:
    arrays = ArrayRecord({"w": Array(weight.astype(np.float32)), "bn.num_batches_tracked": Array(np.array(batches))})
    return reply_from(pid, reply(TrainStats(num_examples=n, train_loss=loss, steps=1), arrays=arrays))


def fedavg(skip_failed: bool = False, fraction: float = 0.5) -> FedAvg:
    strategy = FedAvg(strategy_settings("fedavg", num_rounds=3, fraction=fraction, train=TRAINING),
                      context(skip_failed=skip_failed))
    strategy.bind(federation())
    strategy.global_arrays = MODEL
    return strategy


def test_weighted_average_keeps_dtypes_and_weights_by_examples():
    states = [{"w": np.array([1.0, 2.0], np.float32), "n": np.array(3)},
              {"w": np.array([4.0, 8.0], np.float32), "n": np.array(6)}]
    out = weighted_average(states, [1, 2])
    assert out["w"].dtype == np.float32 and np.allclose(out["w"], [3.0, 6.0])
    assert out["n"].dtype == states[0]["n"].dtype and int(out["n"]) == 5


def test_weighted_average_refuses_nothing_and_weightless_states_and_takes_normalised_weights():
    with pytest.raises(ValueError, match=r"^nothing to average: no client states$"):
        weighted_average([], [])
    state = {"w": np.array([1.0, 2.0])}
    with pytest.raises(ValueError, match=r"^weights must sum to a positive number, got \[0, 0\]$"):
        weighted_average([state, state], [0, 0])
    # Weights that already sum to 1 (DaAgg's) are used as they are: 0.25 * 1 + 0.75 * 5 = 4.
    assert weighted_average([{"w": np.array([1.0])}, {"w": np.array([5.0])}], [0.25, 0.75])["w"].tolist() == [4.0]
    assert weighted_average([state], [7])["w"].tolist() == [1.0, 2.0], "one client: its own state"


def test_the_mean_of_identical_half_precision_states_is_that_state():
    # 7 + 2^-8 from each of 7 clients. Each share is taken in float64; rounded to float16 it would be
    # 1 + 2^-10 (not 1 + 4/7 * 2^-10), and seven of them 7 + 1.75 * 2^-8, which rounds to 7 + 2^-7.
    value = np.array([7.00390625], np.float16)
    out = weighted_average([{"w": value}] * 7, [1] * 7)
    assert out["w"].dtype == np.float16 and out["w"].tolist() == [7.00390625]


@pytest.mark.parametrize("aggregate", [lambda states: weighted_average(states, [1, 1]), coordinate_median],
                         ids=["mean", "median"])
def test_integer_and_boolean_buffers_are_rounded_to_nearest_not_cut(aggregate):
    # 3 and 4 meet at 3.5, which rounds (half to even) to 4 where a cast would cut it to 3; the flags
    # True and False meet at 0.5, which rounds to False where a cast would give True.
    states = [{"i": np.array(3, np.int64), "u": np.array([3], np.uint8), "b": np.array([True])},
              {"i": np.array(4, np.int64), "u": np.array([4], np.uint8), "b": np.array([False])}]
    out = aggregate(states)
    assert int(out["i"]) == 4 and out["u"].tolist() == [4] and out["b"].tolist() == [False]
    assert [out[key].dtype for key in ("i", "u", "b")] == [np.int64, np.uint8, np.bool_]


def test_average_buffers_is_the_plain_mean_of_what_is_not_a_parameter():
    states = [{"w": np.array([1.0]), "bn.mean": np.array([1.0, 3.0])},
              {"w": np.array([9.0]), "bn.mean": np.array([3.0, 7.0])}]
    out = average_buffers(states, ["w"])
    assert list(out) == ["bn.mean"] and out["bn.mean"].tolist() == [2.0, 5.0]
    assert average_buffers(states[:1], ["w"])["bn.mean"].tolist() == [1.0, 3.0], "one client: its buffers"
    assert average_buffers(states, ["w", "bn.mean"]) == {}, "no buffers: nothing to average"


def test_a_peer_pair_state_prefixes_each_networks_arrays_and_needs_the_same_arrays():
    first = ArrayRecord({"w": Array(np.array([1.0], np.float32)), "b": Array(np.array([2.0], np.float32))})
    second = ArrayRecord({"w": Array(np.array([3.0], np.float32)), "b": Array(np.array([4.0], np.float32))})
    pair = peer_pair(first, second)
    assert list(pair.keys()) == ["first.w", "first.b", "second.w", "second.b"]
    assert [float(pair[key].numpy()[0]) for key in pair.keys()] == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"^the two networks of a pair must have the same arrays$"):
        peer_pair(first, ArrayRecord({"w": Array(np.array([3.0], np.float32))}))


def test_fedavg_aggregates_all_arrays_by_num_examples():
    strategy = fedavg()
    strategy.messages({pid: RecordDict() for pid in [1, 3]}, "train")
    replies = [train_reply(1, np.array([1.0, 1.0]), 10, 30, 0.5), train_reply(3, np.array([3.0, 5.0]), 20, 10, 1.5)]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["w"].numpy(), [1.5, 2.0])  # (30*1 + 10*3)/40, (30*1 + 10*5)/40
    assert int(arrays["bn.num_batches_tracked"].numpy()) == 12  # round((30*10 + 10*20)/40) = 12.5 -> 12
    assert metrics["train-loss"] == pytest.approx(0.75)
    assert strategy.history[-1].clients == [1, 3] and strategy.comm_cost == 2


def test_fedavg_aggregation_matches_a_torch_model_average():
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)) for _ in range(2)]
    for model in models:
        model.train()(torch.randn(8, 3))  # moves the BN running stats
    sizes = [10, 30]
    strategy = fedavg()
    strategy.global_arrays = ArrayRecord(models[0].state_dict())
    strategy.messages({pid: RecordDict() for pid in [0, 1]}, "train")
    replies = [reply_from(pid, reply(TrainStats(n, 0.0, 1), arrays=ArrayRecord(m.state_dict())))
               for pid, m, n in zip([0, 1], models, sizes)]
    arrays, _ = strategy.aggregate_train(1, replies)
    merged = arrays.to_torch_state_dict()
    for key, value in models[0].state_dict().items():
        if value.is_floating_point():
            expected = (10 * value + 30 * models[1].state_dict()[key]) / 40
            assert torch.allclose(merged[key], expected, atol=1e-6), key


def test_configure_train_addresses_sampled_partitions_by_node_id():
    strategy = fedavg(fraction=0.5)
    messages = list(strategy.configure_train(3, ArrayRecord(), ConfigRecord(), grid=None))
    assert len(messages) == 2
    pids = [federation().partition_of(m.metadata.dst_node_id) for m in messages]
    assert len(set(pids)) == 2 and all(p in NODES for p in pids)
    assert read_instruction(messages[0].content, TrainIns) == TrainIns(3, TRAINING)


def test_sampling_is_seeded_and_uniform():
    a = [sample_clients(np.random.default_rng(1), list(range(100)), 10) for _ in range(3)]
    b = sample_clients(np.random.default_rng(1), list(range(100)), 10)
    assert a[0] == b and len(set(b)) == 10
    rng = np.random.default_rng(2)
    counts = np.bincount(np.concatenate([sample_clients(rng, list(range(20)), 5) for _ in range(4000)]), minlength=20)
    assert counts.min() > 0.85 * 1000 and counts.max() < 1.15 * 1000
    assert round_size(0.1, 100) == 10 and round_size(0.001, 100) == 1 and round_size(0.1, 100, minimum=15) == 15


def test_sampling_may_take_the_whole_population_and_never_takes_a_client_twice():
    # Drawn with replacement, four of four would repeat a client with probability 0.91 per seed.
    for seed in range(20):
        assert sample_clients(np.random.default_rng(seed), [7, 3, 5, 1], 4) == [1, 3, 5, 7]
    with pytest.raises(ConfigError, match=r"^cannot sample 5 clients from 4$"):
        sample_clients(np.random.default_rng(0), [7, 3, 5, 1], 5)


def test_a_failing_client_stops_the_round_naming_its_partition():
    strategy = fedavg()
    strategy.messages({pid: RecordDict() for pid in [1, 2]}, "train")
    replies = [train_reply(1, np.zeros(2), 0, 5, 0.1), reply_from(2, error="ValueError: disk on fire")]
    with pytest.raises(ClientFailure, match="client 2 failed: ValueError: disk on fire"):
        strategy.aggregate_train(1, replies)


def test_skip_policy_drops_failed_and_silent_clients(caplog):
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [0, 1, 2]}, "train")
    replies = [train_reply(1, np.ones(2), 0, 5, 0.1), reply_from(2, error="boom")]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["w"].numpy(), 1.0)
    assert strategy.history[-1].clients == [1]
    assert "client 0 did not reply in time" in caplog.text and "client 2 failed: boom" in caplog.text
    assert list(strategy.log.answered) == [1], "only a good reply counts as answered (server.held)"


def test_skip_policy_still_fails_when_nobody_is_left():
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [0]}, "train")
    with pytest.raises(ClientFailure, match="no client left"):
        strategy.aggregate_train(1, [])


def test_a_failed_round_names_every_failed_client_in_partition_order():
    """With clients left, the error lists each failure by partition, joined by "; ", and nothing else."""
    strategy = fedavg()
    strategy.messages({pid: RecordDict() for pid in [0, 1, 2, 3]}, "train")
    replies = [reply_from(3, error="Traceback\nOSError: boom"), train_reply(1, np.zeros(2), 0, 5, 0.1),
               reply_from(2, error="ValueError: disk on fire")]
    with pytest.raises(ClientFailure) as failure:
        strategy.aggregate_train(1, replies)
    assert str(failure.value) == ("client 0 did not reply in time; client 2 failed: ValueError: disk on fire; "
                                  "client 3 failed: OSError: boom")


def test_skip_policy_says_when_no_client_is_left():
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [0, 2]}, "train")
    with pytest.raises(ClientFailure) as failure:
        strategy.aggregate_train(1, [reply_from(2, error="boom")])
    assert str(failure.value) == ("client 0 did not reply in time; client 2 failed: boom "
                                  "(no client left in the round)")


def test_skip_policy_reads_the_replies_after_a_failed_one_and_logs_the_whole_reason(caplog):
    """A failed reply does not end the reading of the others; its whole reason goes to the debug
    log, its short reason to the warning that says it was skipped."""
    caplog.set_level(logging.DEBUG, logger="strategies.base")
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [1, 2]}, "train")
    reason = 'Traceback (most recent call last):\n  File "x.py", line 3\nValueError: disk on fire'
    arrays, _ = strategy.aggregate_train(1, [reply_from(2, error=reason), train_reply(1, np.ones(2), 0, 5, 0.1)])
    assert np.allclose(arrays["w"].numpy(), 1.0) and strategy.history[-1].clients == [1]
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "strategies.base"] == [
        (logging.DEBUG, f"client 2 failed with:\n{reason}"),
        (logging.WARNING, "client 2 failed: ValueError: disk on fire; skipped (server.on_client_error=skip)")]


def test_a_malformed_reply_names_the_client_and_the_key_before_aggregation():
    strategy = fedavg()
    strategy.messages({pid: RecordDict() for pid in [1, 3]}, "train")
    good = train_reply(1, np.ones(2), 0, 5, 0.1)
    missing = train_reply(3, np.ones(2), 0, 5, 0.1)
    del missing.content["metrics"]["num-examples"]
    with pytest.raises(ClientFailure, match="client 3 sent a bad message: key 'num-examples' is missing"):
        strategy.aggregate_train(1, [good, missing])
    wrong_type = train_reply(3, np.ones(2), 0, 5, 0.1)
    wrong_type.content["metrics"]["train-loss"] = [1.0, 2.0]
    with pytest.raises(ClientFailure,
                       match=r"client 3 .* key 'train-loss' holds \[1.0, 2.0\] of type list: expected float"):
        strategy.aggregate_train(1, [good, wrong_type])
    no_arrays = reply_from(3, reply(TrainStats(5, 0.1, 1)))
    with pytest.raises(ClientFailure, match="client 3 sent a bad message: key 'arrays' is missing"):
        strategy.aggregate_train(1, [good, no_arrays])
    other_model = reply_from(3, reply(TrainStats(5, 0.1, 1), arrays=ArrayRecord({"v": Array(np.zeros(2, np.float32))})))
    with pytest.raises(ClientFailure,
                       match=r"client 3 .* key 'arrays' do not match the model: missing \['bn.num_batches"):
        strategy.aggregate_train(1, [good, other_model])


def test_skip_policy_drops_a_malformed_reply_with_a_warning(caplog):
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [1, 3]}, "train")
    bad = train_reply(3, np.full(2, 100.0), 0, 5, 0.1)
    bad.content["metrics"]["steps"] = 1.5
    arrays, _ = strategy.aggregate_train(1, [train_reply(1, np.ones(2), 0, 5, 0.1), bad])
    assert np.allclose(arrays["w"].numpy(), 1.0) and strategy.history[-1].clients == [1]
    assert "client 3 sent a bad message: key 'steps' holds 1.5 of type float: expected int; skipped" in caplog.text
    assert list(strategy.log.answered) == [1]


def test_short_reason_keeps_the_exception_line_of_a_ray_traceback():
    reason = "\x1b[36m(ClientAppActor pid=1)\x1b[0m Traceback (most recent call last):\n  File \"x.py\", line 3\n" \
             "ValueError: disk on fire\n\n"
    assert short_reason(reason) == "ValueError: disk on fire"
    assert short_reason("") == "(no reason given)"
    # Ray colours the line that names the error too; the codes go, the text stays.
    coloured = "Traceback\n\x1b[31mValueError: \x1b[1mdisk\x1b[0m on fire\x1b[0m"
    assert short_reason(coloured) == "ValueError: disk on fire"


def test_an_unavailable_node_error_from_the_superlink_names_the_client():
    """The SuperLink answers for a node that stopped sending heartbeats: the error reply comes from
    node id 1 (the SuperLink), so it is matched to the message it answers, not to its sender."""
    strategy = fedavg()
    sent = strategy.messages({pid: RecordDict() for pid in [1, 2]}, "train")
    for message, message_id in zip(sent, ["m-1", "m-2"]):
        message.metadata.__dict__["_message_id"] = message_id  # what the grid does when it pushes
    metadata = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=0, reply_to_message_id="m-2",
                        group_id="", created_at=0.0, ttl=60.0, message_type="train")
    unavailable = Message(error=Error(code=0, reason="Node Unavailable"), metadata=metadata)
    with pytest.raises(ClientFailure, match="client 2 failed: Node Unavailable"):
        strategy.aggregate_train(1, [train_reply(1, np.zeros(2), 0, 5, 0.1), unavailable])


def test_answering_node_prefers_the_answered_message_over_the_sender():
    sent = [Message(content=RecordDict(), message_type="query.info", dst_node_id=node) for node in (4_242, 77)]
    for message, message_id in zip(sent, ["a", "b"]):
        message.metadata.__dict__["_message_id"] = message_id
    metadata = Metadata(run_id=1, message_id="", src_node_id=1, dst_node_id=0, reply_to_message_id="b",
                        group_id="", created_at=0.0, ttl=60.0, message_type="query.info")
    from_superlink = Message(error=Error(code=0, reason="Node Unavailable"), metadata=metadata)
    assert answering_node(from_superlink, sent) == 77
    assert answering_node(reply_from(1, error="boom"), sent) == 4_242  # no answered id: the sender


def test_the_result_holds_the_final_arrays_and_every_rounds_metrics(local_grid, prepared_run):
    """A strategy's start() returns Flower's Result filled from its run log and its observer."""
    overrides, _, arrays = prepared_run("experiment=smoke strategy=fedavg strategy.num_rounds=3 "
                                        "strategy.train.epochs=1")
    plan = load_run(compose_config(overrides.split()))
    grid = local_grid(overrides, 10)
    strategy = plan.strategy.build(plan.context())
    strategy.bind(discover(grid, 10, wait_timeout=1, reply_timeout=1))
    seen = []
    strategy.observe(lambda info, new: seen.append(info)
                     or (MetricRecord({"accuracy": 0.5}) if info.round > 1 else None))
    result = strategy.start(grid, arrays, timeout=5)
    assert [info.round for info in seen] == [1, 2, 3] and [info.comm_cost for info in seen] == [3, 6, 9]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert sorted(result.evaluate_metrics_serverapp) == [2, 3]
    assert result.arrays.keys() == arrays.keys()
    assert any(not np.array_equal(result.arrays[k].numpy(), arrays[k].numpy()) for k in arrays)
    assert all(m.metadata.message_type in ("query.info", "train") for m in grid.delivered)
    assert CONFIG in grid.delivered[-1].content
