"""The ClientApp handlers called as Flower calls them: a Message and a Context in, a reply out."""

import numpy as np
import pytest
from defaults import local_training
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from client import app as client_app
from client.plugins import base as plugin_base
from common.errors import ConfigError
from protocol.codec import ProtocolError, encode
from protocol.feddyn import FedDynIns
from protocol.messages import METRICS, NodeInfo, Scores, TrainIns, TrainStats, instruction, read_reply
from task.learner_settings import LearnerSchedule

TRAINING = local_training(lr=0.05, epochs=1, batch_size=16)


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke")


def test_info_reports_partition_and_size(run, incoming, node_context):
    overrides, scene, _ = run
    reply = client_app.info(incoming(instruction(), "query.info"), node_context(overrides, 4))
    # A virtual node of the test grid, as of the simulation runtime: it also tells the federation's size.
    assert read_reply(reply.content, NodeInfo, "node") == NodeInfo(4, int(scene.client_sizes()[4]), 1, 10)


def test_train_returns_new_arrays_and_stats(run, incoming, node_context):
    overrides, scene, arrays = run
    content = instruction(TrainIns(1, TRAINING), arrays=arrays)
    reply = client_app.train(incoming(content, "train"), node_context(overrides, 2))
    stats = read_reply(reply.content, TrainStats, "client 2")
    assert stats.num_examples == scene.client_sizes()[2] and stats.steps > 0
    before, after = arrays.to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
    assert before.keys() == after.keys()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    again = client_app.train(incoming(content, "train"), node_context(overrides, 2))
    again_state = again.content["arrays"].to_torch_state_dict()
    assert all(np.array_equal(after[k].numpy(), v.numpy()) for k, v in again_state.items()), \
        "same round, same client: same update"


def test_evaluate_scores_the_local_set(run, incoming, node_context):
    overrides, _, arrays = run
    reply = client_app.evaluate(incoming(instruction(arrays=arrays), "evaluate"), node_context(overrides, 0))
    scores = read_reply(reply.content, Scores, "client 0")
    assert 0.0 <= scores.accuracy <= 1.0 and scores.loss > 0


def test_a_bad_train_instruction_names_the_sender_and_the_key(run, incoming, node_context):
    overrides, _, arrays = run
    config = {**encode(TrainIns(1, local_training(lr=0.1, epochs=1, batch_size=16))), "lr": -1.0}
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
    with pytest.raises(ProtocolError,
                       match="the server sent a bad message: key 'lr' is invalid: allowed is a finite number > 0"):
        client_app.train(incoming(content, "train"), node_context(overrides, 0))
    del config["epochs"]
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({**config, "lr": 0.1})})
    with pytest.raises(ProtocolError, match="key 'epochs' is missing"):
        client_app.train(incoming(content, "train"), node_context(overrides, 0))


def test_an_unknown_client_method_is_named(run, incoming, node_context):
    overrides, _, arrays = run
    content = instruction(TrainIns(1, TRAINING, plugin="fedmagic"), arrays=arrays)
    known = "'', 'fedcorr', 'feddiv', 'feddyn', 'fedes', 'fednoro'"
    with pytest.raises(ValueError, match=f"client plug-in 'fedmagic'; this node knows {known}"):
        client_app.train(incoming(content, "train"), node_context(overrides, 0))


def test_a_node_without_partition_is_a_clear_error(run, incoming, node_context):
    overrides, _, _ = run
    bare = Context(run_id=1, node_id=77, node_config={}, state=RecordDict(), run_config={"overrides": overrides})
    with pytest.raises(ConfigError, match="partition-id"):
        client_app.info(incoming(instruction(), "query.info"), bare)


def test_feddyn_train_keeps_its_correction_as_client_state(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 1)
    content = instruction(TrainIns(1, TRAINING, plugin="feddyn"), arrays=arrays, plugin_ins=FedDynIns(alpha=0.1),
                          plugin="feddyn")
    local = client_app.train(incoming(content, "train"), context).content["arrays"].to_torch_state_dict()
    start = arrays.to_torch_state_dict()
    stored = context.state.array_records["feddyn-correction"]
    assert sorted(stored) == sorted(name for name in start if not name.endswith("num_batches_tracked")
                                    and "running" not in name)
    for name in stored:
        # First round: g = 0 - alpha * (w_local - w_global).
        np.testing.assert_allclose(stored[name].numpy(), -0.1 * (local[name] - start[name]).numpy(),
                                   rtol=1e-5, atol=1e-7)
    # A second round starts from the stored g: its update differs from a client without the state.
    again = client_app.train(incoming(content, "train"), context).content["arrays"].to_torch_state_dict()
    fresh_reply = client_app.train(incoming(content, "train"), node_context(overrides, 1))
    fresh = fresh_reply.content["arrays"].to_torch_state_dict()
    assert any(not np.allclose(again[k].numpy(), fresh[k].numpy()) for k in stored)


def test_loss_query_reports_the_global_models_local_loss(run, incoming, node_context):
    overrides, _, arrays = run
    message = instruction(arrays=arrays)
    loss = read_reply(client_app.loss(incoming(message, "query.loss"), node_context(overrides, 3)).content,
                      Scores, "c")
    scores = read_reply(client_app.evaluate(incoming(message, "evaluate"), node_context(overrides, 3)).content,
                        Scores, "c")
    assert loss == scores and loss.loss > 0
    assert set(client_app.loss(incoming(message, "query.loss"), node_context(overrides, 3)).content) == {METRICS}


def test_plain_training_uses_the_instructions_round_schedule_and_the_nodes_current_labels(monkeypatch):
    # local_update falls back to the node's own labels and the default (empty) schedule, so the plug-in must
    # pass the corrected labels, the sent schedule and the round (which picks the node's random stream).
    corrected = np.array([2, 0, 1])
    seen = {}

    def recording_update(node, state, hooks, server_round, labels=None):
        seen.update(node=node, state=state, hooks=hooks, server_round=server_round, labels=labels)
        return "model", "stats"

    monkeypatch.setattr(plugin_base, "local_update", recording_update)
    monkeypatch.setattr(plugin_base, "current_labels",
                        lambda context, node: corrected if (context, node) == ("context", "node") else None)
    schedule = LearnerSchedule(distill_weight=0.25, forget_rate=0.5)
    ins = TrainIns(7, TRAINING, schedule=schedule)
    arrays = ArrayRecord({"w": Array(np.array([1.0, -2.0], np.float32))})
    trained = plugin_base.ClientPlugin().train("node", "context", ins, instruction(ins, arrays=arrays))
    assert (trained.model, trained.stats) == ("model", "stats")
    assert seen["node"] == "node" and seen["server_round"] == 7 and seen["labels"] is corrected
    assert seen["hooks"].schedule == schedule and seen["hooks"].training == TRAINING
    assert list(seen["state"]) == ["w"] and seen["state"]["w"].tolist() == [1.0, -2.0]


def test_plain_training_without_arrays_blames_the_server():
    # The arrays come from the server: a message without them names it as the sender.
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing"):
        plugin_base.ClientPlugin().train("node", "context", TrainIns(1, TRAINING), instruction(TrainIns(1, TRAINING)))
