"""FedCorr's client handlers: LID in training, query.correct, and label state that outlives the process."""

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from client import app as client_app
from client import node as client_node
from client.label_state import current_labels

TRAIN = {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.0, "epochs": 1, "batch_size": 16,
         "mixup_alpha": 1.0, "prox_weight": 0.5, "prox_norm": "squared"}


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke strategy=fedcorr noise.rho=1.0 noise.tau=0.5")


def correct(incoming, context: Context, arrays, **config) -> dict:
    settings = {"mode": "stage1", "pi": 0.5, "theta": 0.5, "relabel": True, "seed": 1, "diagnostics": True, **config}
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(settings)})
    return dict(client_app.correct(incoming(content, "query.correct"), context).content["metrics"])


def test_stage1_training_reports_a_finite_lid(run, incoming, node_context):
    overrides, _, arrays = run
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(
        {**TRAIN, "server-round": 1, "compute-lid": True, "lid-k": 20})})
    metrics = client_app.train(incoming(content, "train"), node_context(overrides, 1)).content["metrics"]
    assert math.isfinite(metrics["lid"]) and metrics["lid"] >= 0


def test_stage1_correction_estimates_noise_and_reports_diagnostics(run, incoming, node_context):
    overrides, scene, arrays = run
    metrics = correct(incoming, node_context(overrides, 3), arrays)
    assert 0.0 <= metrics["mu_hat"] <= 1.0
    assert metrics["known"] == scene.client_sizes()[3]
    assert metrics["wrong-before"] == int(np.sum(scene.noisy_labels[scene.rows(3)] != scene.true_labels[scene.rows(3)]))
    assert metrics["changed"] == metrics["n_relabeled"]


def test_without_relabel_the_labels_stay(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 2)
    metrics = correct(incoming, context, arrays, mode="stage2", theta=0.0, relabel=False)
    assert metrics["n_relabeled"] == 0 and "mu_hat" not in metrics
    assert np.array_equal(current_labels(context, client_node.load_node(context)), scene.noisy_labels[scene.rows(2)])


def test_corrected_labels_survive_a_recreated_client_process(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 0)
    # theta = 0: every sample takes the global model's argmax, so the labels surely change.
    metrics = correct(incoming, context, arrays, mode="stage2", theta=0.0)
    assert metrics["n_relabeled"] > 0
    # A deployed SuperNode runs each message in a fresh process: nothing cached survives, only context.state.
    client_node._load_partition.cache_clear()
    client_node._scene.cache_clear()
    node = client_node.load_node(context)
    stored = current_labels(context, node)
    assert not np.array_equal(stored, node.data.labels)
    scores = client_app.evaluate(incoming(RecordDict({"arrays": arrays}), "evaluate"), context).content["metrics"]
    assert scores["accuracy"] == 1.0, "evaluation uses the corrected labels (the model's own argmax)"


def test_unknown_correction_mode_is_rejected(run, incoming, node_context):
    overrides, _, arrays = run
    with pytest.raises(ValueError, match="mode='stage3' is invalid"):
        correct(incoming, node_context(overrides, 0), arrays, mode="stage3")


def test_corrected_labels_survive_a_restarted_supernode_with_a_state_dir(run, incoming, tmp_path):
    overrides, scene, arrays = run

    def node_context(run_id: int = 1) -> Context:
        # A restarted SuperNode: same node config, but an empty context.state.
        return Context(run_id=run_id, node_id=77, node_config={"partition-id": 2, "state-dir": str(tmp_path)},
                       state=RecordDict(), run_config={"overrides": overrides})

    first = node_context()
    assert correct(incoming, first, arrays, mode="stage2", theta=0.0)["n_relabeled"] > 0
    corrected = current_labels(first, client_node.load_node(first))
    saved = list(tmp_path.rglob("*.npz"))
    assert [p.relative_to(tmp_path).as_posix() for p in saved] == ["run-1/partition-2/fedcorr-labels.npz"]
    restarted = node_context()
    assert np.array_equal(current_labels(restarted, client_node.load_node(restarted)), corrected)
    # Another run on the same node starts from the node's own labels, not this run's corrections.
    other_run = node_context(run_id=2)
    assert np.array_equal(current_labels(other_run, client_node.load_node(other_run)), scene.noisy_labels[scene.rows(2)])
    # A torn or foreign file is a clear error, not silently wrong labels.
    saved[0].write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="saved state .* is unreadable"):
        current_labels(node_context(), client_node.load_node(first))
