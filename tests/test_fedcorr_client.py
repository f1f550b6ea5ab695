"""FedCorr's client plug-in: LID after stage-1 training, query.correct, and label state that outlives
the process."""

import math

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client import app as client_app
from client import node as client_node
from client.label_state import current_labels
from protocol.codec import ProtocolError
from protocol.fedcorr import CorrectIns, CorrectRes, LidScore, Stage1Options
from protocol.messages import TrainIns, instruction, read_extra, read_reply
from task.local_training import LocalTraining

TRAINING = LocalTraining(lr=0.05, epochs=1, batch_size=16, mixup_alpha=1.0, prox_weight=0.5)


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke strategy=fedcorr noise.rho=1.0 noise.tau=0.5")


def train_stage1(incoming, context: Context, arrays, server_round: int = 1, keep_losses: bool = True):
    content = instruction(TrainIns(server_round, TRAINING, method="fedcorr"), arrays=arrays,
                          options=Stage1Options(lid_k=20, keep_losses=keep_losses), method="fedcorr")
    return client_app.train(incoming(content, "train"), context)


def correct(incoming, context: Context, arrays, **changes) -> CorrectRes:
    settings = {"mode": "stage1", "pi": 0.5, "theta": 0.5, "relabel": True, "seed": 1, "diagnostics": True, **changes}
    content = instruction(CorrectIns(**settings), arrays=arrays)
    return read_reply(client_app.app(incoming(content, "query.correct"), context).content, CorrectRes, "client")


def test_stage1_training_reports_a_finite_lid(run, incoming, node_context):
    overrides, _, arrays = run
    content = instruction(TrainIns(1, TRAINING, method="fedcorr"), arrays=arrays, options=Stage1Options(lid_k=20),
                          method="fedcorr")
    reply = client_app.train(incoming(content, "train"), node_context(overrides, 1))
    lid = read_extra(reply.content, "fedcorr", LidScore, "client 1").lid
    assert math.isfinite(lid) and lid >= 0


def test_stage1_correction_estimates_noise_and_reports_diagnostics(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 3)
    train_stage1(incoming, context, arrays)
    res = correct(incoming, context, arrays)
    assert res.mu_hat is not None and 0.0 <= res.mu_hat <= 1.0
    counts = res.diagnostics
    assert counts is not None and counts.known == scene.client_sizes()[3]
    assert counts.wrong_before == int(np.sum(scene.noisy_labels[scene.rows(3)] != scene.true_labels[scene.rows(3)]))
    assert counts.changed == res.n_relabeled


def test_without_diagnostics_only_counts_and_mu_hat_leave_the_client(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 4)
    train_stage1(incoming, context, arrays)
    content = instruction(CorrectIns(mode="stage1", pi=0.5, theta=0.5, seed=1), arrays=arrays)
    reply = client_app.app(incoming(content, "query.correct"), context).content
    assert set(reply) == {"metrics"} and set(reply["metrics"]) == {"n-relabeled", "mu-hat"}


def test_without_relabel_the_labels_stay(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 2)
    res = correct(incoming, context, arrays, mode="stage2", theta=0.0, relabel=False)
    assert res.n_relabeled == 0 and res.mu_hat is None
    assert np.array_equal(current_labels(context, client_node.load_node(context)), scene.noisy_labels[scene.rows(2)])


def test_corrected_labels_survive_a_recreated_client_process(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 0)
    # theta = 0: every sample takes the global model's argmax, so the labels surely change.
    assert correct(incoming, context, arrays, mode="stage2", theta=0.0).n_relabeled > 0
    # A deployed SuperNode runs each message in a fresh process: nothing cached survives, only context.state.
    client_node._load_partition.cache_clear()
    client_node._scene.cache_clear()
    node = client_node.load_node(context)
    stored = current_labels(context, node)
    assert not np.array_equal(stored, node.data.labels)
    reply = client_app.evaluate(incoming(instruction(arrays=arrays), "evaluate"), context).content
    assert reply["metrics"]["accuracy"] == 1.0, "evaluation uses the corrected labels (the model's own argmax)"


def test_an_unknown_correction_mode_is_refused_naming_the_key(run, incoming, node_context):
    overrides, _, arrays = run
    content = instruction(CorrectIns(mode="stage1", pi=0.5, theta=0.5), arrays=arrays)
    content["config"]["mode"] = "stage3"
    with pytest.raises(ProtocolError, match="key 'mode' is invalid: allowed are stage1, stage2"):
        client_app.app(incoming(content, "query.correct"), node_context(overrides, 0))


def test_corrected_labels_survive_a_restarted_supernode_with_a_state_dir(run, incoming, tmp_path):
    overrides, scene, arrays = run

    def node_context(run_id: int = 1) -> Context:
        # A restarted SuperNode: same node config, but an empty context.state.
        return Context(run_id=run_id, node_id=77, node_config={"partition-id": 2, "state-dir": str(tmp_path)},
                       state=RecordDict(), run_config={"overrides": overrides})

    first = node_context()
    assert correct(incoming, first, arrays, mode="stage2", theta=0.0).n_relabeled > 0
    corrected = current_labels(first, client_node.load_node(first))
    saved = list(tmp_path.rglob("*.npz"))
    assert [p.relative_to(tmp_path).as_posix() for p in saved] == ["run-1/partition-2/fedcorr-labels.npz"]
    restarted = node_context()
    assert np.array_equal(current_labels(restarted, client_node.load_node(restarted)), corrected)
    # Another run on the same node starts from the node's own labels, not this run's corrections.
    other_run = node_context(run_id=2)
    assert np.array_equal(current_labels(other_run, client_node.load_node(other_run)),
                          scene.noisy_labels[scene.rows(2)])
    # A torn or foreign file is a clear error, not silently wrong labels.
    saved[0].write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="saved state .* is unreadable"):
        current_labels(node_context(), client_node.load_node(first))
