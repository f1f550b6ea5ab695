"""The strategies' shared machinery: aggregation, seeded sampling, addressing, and the checks every
reply passes (failure policy and protocol) before it is aggregated."""

import numpy as np
import pytest
import torch
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord, RecordDict

from protocol.messages import CONFIG, TrainIns, TrainStats, read_instruction, reply
from server.config import load_run
from server.discovery import discover
from settings.compose import compose_config
from strategies.aggregation import weighted_average
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


def test_skip_policy_still_fails_when_nobody_is_left():
    strategy = fedavg(skip_failed=True)
    strategy.messages({pid: RecordDict() for pid in [0]}, "train")
    with pytest.raises(ClientFailure, match="no client left"):
        strategy.aggregate_train(1, [])


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


def test_short_reason_keeps_the_exception_line_of_a_ray_traceback():
    reason = "\x1b[36m(ClientAppActor pid=1)\x1b[0m Traceback (most recent call last):\n  File \"x.py\", line 3\n" \
             "ValueError: disk on fire\n\n"
    assert short_reason(reason) == "ValueError: disk on fire"
    assert short_reason("") == "(no reason given)"


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
