"""The message protocol: typed payloads to Flower records and back, every key and type checked."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from defaults import local_training
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from protocol.codec import ProtocolError, decode, encode, keys_of, record_key
from protocol.fedcorr import CorrectIns, CorrectRes, Diagnostics
from protocol.messages import (
    NodeInfo,
    TrainIns,
    TrainStats,
    instruction,
    read_arrays,
    read_instruction,
    read_plugin_ins,
    read_reply,
    reply,
)


def test_one_naming_style_for_every_key():
    assert record_key("num_examples") == "num-examples"
    keys = keys_of(TrainIns) + keys_of(TrainStats) + keys_of(CorrectIns) + keys_of(CorrectRes) + keys_of(NodeInfo)
    assert all(key == key.lower() and "_" not in key and " " not in key for key in keys)
    assert keys_of(TrainIns)[:11] == ["server-round", "lr", "optimizer", "momentum", "weight-decay", "epochs",
                                      "batch-size", "learner", "mixup-alpha", "prox-weight", "prox-norm"]
    # Each learner's options under its own name, so two learners may share an option name.
    assert "lsr.gamma" in keys_of(TrainIns) and "sce.alpha" in keys_of(TrainIns)
    assert keys_of(TrainIns)[-3:] == ["plugin", "schedule.distill-weight", "schedule.forget-rate"]


def test_instructions_and_replies_round_trip_through_flower_records():
    ins = TrainIns(7, local_training(lr=0.02, mixup_alpha=1.0, prox_weight=2.5, prox_norm="l2"), plugin="fedcorr")
    arrays = ArrayRecord({"w": Array(np.arange(3, dtype=np.float32))})
    content = instruction(ins, arrays=arrays, plugin_ins=NodeInfo(1, 2, 1), plugin="fedcorr")
    assert isinstance(content["config"], ConfigRecord) and isinstance(content["fedcorr"], ConfigRecord)
    assert read_instruction(content, TrainIns) == ins
    assert read_plugin_ins(content, "fedcorr", NodeInfo) == NodeInfo(1, 2, 1)
    assert np.array_equal(read_arrays(content, "the server")["w"].numpy(), [0, 1, 2])
    res = CorrectRes(n_relabeled=4, mu_hat=0.25, diagnostics=Diagnostics(10, 5, 2, 4, 3))
    answer = reply(res)
    assert isinstance(answer["metrics"], MetricRecord)
    assert read_reply(answer, CorrectRes, "client 3") == res


def test_optional_fields_and_nested_payloads_are_all_there_or_all_absent():
    assert read_reply(reply(CorrectRes(n_relabeled=0)), CorrectRes, "client 0") == CorrectRes(0)
    partial = reply(CorrectRes(2, 0.1, Diagnostics(10, 5, 2, 4, 3)))
    del partial["metrics"]["wrong-after"]
    with pytest.raises(ProtocolError, match="client 1 sent a bad message: key 'wrong-after' is missing"):
        read_reply(partial, CorrectRes, "client 1")


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.pop("partition-id"), r"client 5 sent a bad message: key 'partition-id' is missing"),
    (lambda r: r.__setitem__("num-examples", 2.5), r"key 'num-examples' holds 2.5 of type float: expected int"),
    (lambda r: r.__setitem__("rank", 1), r"key 'rank' is not part of a NodeInfo"),
])
def test_a_bad_record_names_the_sender_and_the_key(change, message):
    record = dict(encode(NodeInfo(3, 40, 0)))
    change(record)
    with pytest.raises(ProtocolError, match=message):
        decode(NodeInfo, record, "client 5")


def test_a_value_the_payload_refuses_is_named_by_its_record_key():
    record = encode(CorrectIns(mode="stage1", pi=0.5, theta=0.5, split_losses="local", rank_losses="global"))
    with pytest.raises(ProtocolError, match=r"the server sent a bad message: key 'pi' is invalid: allowed is a number"):
        decode(CorrectIns, {**record, "pi": 1.5}, "the server")
    with pytest.raises(ProtocolError, match=r"key 'lr' is invalid: allowed is a finite number > 0"):
        decode(TrainIns, {**encode(TrainIns(1, local_training(lr=0.1))), "lr": float("nan")}, "the server")


def test_a_missing_or_mistyped_record_is_named():
    with pytest.raises(ProtocolError, match="client 2 sent a bad message: key 'metrics' is missing"):
        read_reply(RecordDict(), NodeInfo, "client 2")
    with pytest.raises(ProtocolError, match="key 'metrics' holds a ConfigRecord: expected a MetricRecord"):
        read_reply(RecordDict({"metrics": ConfigRecord({"partition-id": 1})}), NodeInfo, "client 2")
    model = ArrayRecord({"w": Array(np.zeros((2, 3), np.float32))})
    other = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros((3, 2), np.float32))})})
    with pytest.raises(ProtocolError, match=r"array 'w' has shape \(3, 2\): expected \(2, 3\)"):
        read_arrays(other, "client 2", like=model)


def test_payloads_hold_only_scalars():
    @dataclass(frozen=True)
    class Listy:
        values: list

    with pytest.raises(TypeError, match="not a scalar"):
        encode(Listy([1, 2]))


def test_count_vectors_travel_as_lists_and_anything_else_is_refused():
    res = CorrectRes(3, 0.25, Diagnostics(10, 4, 2, 3, 2, confusion_before=(1, 2, 3, 4), confusion_after=(4, 3, 2, 1)))
    record = encode(res)
    assert record["confusion-before"] == [1, 2, 3, 4]
    assert decode(CorrectRes, record, "client 1") == res
    with pytest.raises(ProtocolError, match="key 'confusion-after' holds \\[1.5\\]: expected a list of integer counts"):
        decode(CorrectRes, {**record, "confusion-after": [1.5]}, "client 1")
