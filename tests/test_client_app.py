"""The ClientApp handlers called as Flower calls them: a Message and a Context in, a reply out."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from client import app as client_app

TRAIN = {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.0, "epochs": 1, "batch_size": 16,
         "mixup_alpha": 0.0, "prox_weight": 0.0, "prox_norm": "squared"}


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke")


def test_info_reports_partition_and_size(run, incoming, node_context):
    overrides, scene, _ = run
    reply = client_app.info(incoming(RecordDict(), "query.info"), node_context(overrides, 4))
    assert reply.content["info"]["partition-id"] == 4
    assert reply.content["info"]["num-examples"] == scene.client_sizes()[4]


def test_train_returns_new_arrays_and_metrics(run, incoming, node_context):
    overrides, scene, arrays = run
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({**TRAIN, "server-round": 1})})
    reply = client_app.train(incoming(content, "train"), node_context(overrides, 2))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == scene.client_sizes()[2] and metrics["steps"] > 0
    before, after = arrays.to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
    assert before.keys() == after.keys()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    again = client_app.train(incoming(content, "train"), node_context(overrides, 2))
    assert all(np.array_equal(after[k].numpy(), v.numpy()) for k, v in again.content["arrays"].to_torch_state_dict().items()), \
        "same round, same client: same update"


def test_evaluate_scores_the_local_set(run, incoming, node_context):
    overrides, _, arrays = run
    reply = client_app.evaluate(incoming(RecordDict({"arrays": arrays}), "evaluate"), node_context(overrides, 0))
    metrics = reply.content["metrics"]
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0


def test_bad_train_config_is_a_clear_error(run, incoming, node_context):
    overrides, _, arrays = run
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({**TRAIN, "lr": -1.0, "server-round": 1})})
    with pytest.raises(ValueError, match="lr=-1.0 is invalid"):
        client_app.train(incoming(content, "train"), node_context(overrides, 0))


def test_a_node_without_partition_is_a_clear_error(run, incoming, node_context):
    overrides, _, _ = run
    bare = Context(run_id=1, node_id=77, node_config={}, state=RecordDict(), run_config={"overrides": overrides})
    with pytest.raises(ValueError, match="partition-id"):
        client_app.info(incoming(RecordDict(), "query.info"), bare)


def test_feddyn_train_keeps_its_correction_as_client_state(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 1)
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({**TRAIN, "server-round": 1, "feddyn-alpha": 0.1})})
    local = client_app.train(incoming(content, "train"), context).content["arrays"].to_torch_state_dict()
    start = arrays.to_torch_state_dict()
    stored = context.state.array_records["feddyn-correction"]
    assert sorted(stored) == sorted(name for name in start if not name.endswith("num_batches_tracked")
                                    and "running" not in name)
    for name in stored:
        # First round: g = 0 - alpha * (w_local - w_global).
        np.testing.assert_allclose(stored[name].numpy(), -0.1 * (local[name] - start[name]).numpy(), rtol=1e-5, atol=1e-7)
    # A second round starts from the stored g: its update differs from a client without the state.
    again = client_app.train(incoming(content, "train"), context).content["arrays"].to_torch_state_dict()
    fresh = client_app.train(incoming(content, "train"), node_context(overrides, 1)).content["arrays"].to_torch_state_dict()
    assert any(not np.allclose(again[k].numpy(), fresh[k].numpy()) for k in stored)


def test_loss_query_reports_the_global_models_local_loss(run, incoming, node_context):
    overrides, _, arrays = run
    message = RecordDict({"arrays": arrays})
    loss = client_app.loss(incoming(message, "query.loss"), node_context(overrides, 3)).content["metrics"]
    scores = client_app.evaluate(incoming(message, "evaluate"), node_context(overrides, 3)).content["metrics"]
    assert loss["loss"] == scores["loss"] > 0 and loss["num-examples"] == scores["num-examples"]
