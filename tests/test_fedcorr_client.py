"""FedCorr's client plug-in: LID after stage-1 training, query.correct, and label state that outlives
the process."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from defaults import local_training
from flwr.app import ArrayRecord, Context, RecordDict

from client import app as client_app
from client import node as client_node
from client.label_state import current_labels, load_local_losses, store_local_losses
from client.plugins import fedcorr as fedcorr_plugin
from common.seeding import rng_for
from protocol.codec import ProtocolError
from protocol.fedcorr import CorrectIns, CorrectRes, LidRes, Stage1Ins
from protocol.messages import StateScope, TrainIns, instruction, read_extra, read_reply, with_scope
from task.correction import loss_split
from task.evaluation import loss_and_proba
from task.lid import lid_score

TRAINING = local_training(lr=0.05, epochs=1, batch_size=16, learner="mixup", prox_weight=0.5)


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke strategy=fedcorr noise.rho=1.0 noise.tau=0.5")


def scoped(content: RecordDict, scope: StateScope | None) -> RecordDict:
    """``content`` as a run's round sends it (with ``scope``), or as a test outside a run does (None)."""
    return content if scope is None else with_scope(content, scope)


def train_stage1(incoming, context: Context, arrays, server_round: int = 1, keep_losses: bool = True,
                 scope: StateScope | None = None, lid_k: int = 20):
    content = instruction(TrainIns(server_round, TRAINING, plugin="fedcorr"), arrays=arrays,
                          plugin_ins=Stage1Ins(lid_k=lid_k, keep_losses=keep_losses), plugin="fedcorr")
    return client_app.train(incoming(scoped(content, scope), "train"), context)


def correct(incoming, context: Context, arrays, scope: StateScope | None = None, **changes) -> CorrectRes:
    settings = {"mode": "stage1", "pi": 0.5, "theta": 0.5, "split_losses": "local", "rank_losses": "global",
                "relabel": True, "seed": 1, "diagnostics": True, **changes}
    content = scoped(instruction(CorrectIns(**settings), arrays=arrays), scope)
    return read_reply(client_app.app(incoming(content, "query.correct"), context).content, CorrectRes, "client")


def test_stage1_training_reports_a_finite_lid(run, incoming, node_context):
    overrides, _, arrays = run
    content = instruction(TrainIns(1, TRAINING, plugin="fedcorr"), arrays=arrays, plugin_ins=Stage1Ins(lid_k=20),
                          plugin="fedcorr")
    reply = client_app.train(incoming(content, "train"), node_context(overrides, 1))
    lid = read_extra(reply.content, "fedcorr", LidRes, "client 1").lid
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
    # The sample split against the truth: every known sample in one cell, D_n is what mu_hat counts.
    tp, fp, fn, tn = counts.split_tp, counts.split_fp, counts.split_fn, counts.split_tn
    assert None not in (tp, fp, fn, tn) and tp + fp + fn + tn == counts.known
    assert tp + fn == counts.wrong_before and tp + fp == round(res.mu_hat * counts.known)
    # Fig. 8's confusion counts: M x M, summing to the known samples, the diagonal the right labels.
    classes = 10
    for matrix, wrong in ((counts.confusion_before, counts.wrong_before), (counts.confusion_after, counts.wrong_after)):
        grid = np.array(matrix).reshape(classes, classes)
        assert grid.sum() == counts.known and np.trace(grid) == counts.known - wrong
    truth, held = scene.true_labels[scene.rows(3)], scene.noisy_labels[scene.rows(3)]
    assert np.array(counts.confusion_before).reshape(classes, classes)[truth[0], held[0]] >= 1


def test_without_diagnostics_only_counts_and_mu_hat_leave_the_client(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 4)
    train_stage1(incoming, context, arrays)
    content = instruction(CorrectIns(mode="stage1", pi=0.5, theta=0.5, split_losses="local",
                                     rank_losses="global", seed=1), arrays=arrays)
    reply = client_app.app(incoming(content, "query.correct"), context).content
    assert set(reply) == {"metrics"} and set(reply["metrics"]) == {"n-relabeled", "mu-hat"}
    # Stage 2 never sends a split either way; with diagnostics it sends counts, never per-sample values.
    res = correct(incoming, context, arrays, mode="stage2")
    assert res.diagnostics is not None and res.diagnostics.split_tp is None
    assert len(res.diagnostics.confusion_after or ()) == 100


def test_without_relabel_the_labels_stay(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 2)
    res = correct(incoming, context, arrays, mode="stage2", theta=0.0, relabel=False)
    assert res.n_relabeled == 0 and res.mu_hat is None
    assert np.array_equal(current_labels(context, client_node.load_node(context)), scene.noisy_labels[scene.rows(2)])


def test_stage2_on_the_noisy_subset_relabels_only_the_global_models_high_loss_samples(
        run, incoming, node_context, monkeypatch):
    overrides, scene, arrays = run
    context = node_context(overrides, 3)
    node = client_node.load_node(context)
    given = current_labels(context, node).copy()
    seeds: list[int] = []

    def seeded(losses: np.ndarray, seed: int) -> np.ndarray:
        seeds.append(seed)
        return loss_split(losses, seed)

    monkeypatch.setattr(fedcorr_plugin, "loss_split", seeded)
    res = correct(incoming, context, arrays, mode="stage2", theta=0.0, stage2_rows="noisy_subset")
    assert seeds == [int(rng_for(1, "loss-gmm/3").integers(2**31))], "seeded as stage 1's split"
    model = node.new_model()
    model.load_state_dict(arrays.to_torch_state_dict())
    losses, probabilities = loss_and_proba(model, node.data.images, given, node.eval_transform)
    noisy = loss_split(losses, int(rng_for(1, "loss-gmm/3").integers(2**31)))
    assert 0 < noisy.sum() < noisy.size
    after = current_labels(context, node)
    assert np.array_equal(after, np.where(noisy, probabilities.argmax(axis=1), given))
    assert res.n_relabeled == int(np.sum(after != given)) > 0
    everything = node_context(overrides, 3)
    assert correct(incoming, everything, arrays, mode="stage2", theta=0.0).n_relabeled > res.n_relabeled


def test_stage2_keep_leaves_the_labels_the_global_model_finds_that_likely(run, incoming, node_context):
    overrides, scene, arrays = run
    context = node_context(overrides, 4)
    node = client_node.load_node(context)
    given = current_labels(context, node).copy()
    res = correct(incoming, context, arrays, mode="stage2", theta=0.0, stage2_keep=0.1)
    model = node.new_model()
    model.load_state_dict(arrays.to_torch_state_dict())
    _, probabilities = loss_and_proba(model, node.data.images, given, node.eval_transform)
    likely = probabilities[np.arange(given.size), given] >= 0.1
    after = current_labels(context, node)
    assert np.array_equal(after, np.where(likely, given, probabilities.argmax(axis=1)))
    assert res.n_relabeled == int(np.sum(after != given)) > 0
    assert correct(incoming, node_context(overrides, 4), arrays, mode="stage2", theta=0.0).n_relabeled > res.n_relabeled


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
    content = instruction(CorrectIns(mode="stage1", pi=0.5, theta=0.5, split_losses="local",
                                     rank_losses="global"), arrays=arrays)
    content["config"]["mode"] = "stage3"
    with pytest.raises(ProtocolError, match="key 'mode' is invalid: allowed are stage1, stage2"):
        client_app.app(incoming(content, "query.correct"), node_context(overrides, 0))


def labels_in(incoming, context: Context, scope: StateScope | None) -> np.ndarray:
    """The labels the node reads while handling an instruction of ``scope`` (None: one without a scope)."""
    node = client_app.node_for(incoming(scoped(RecordDict(), scope), "evaluate"), context)
    return current_labels(context, node)


def test_corrected_labels_survive_a_restarted_supernode_with_a_state_dir(run, incoming, tmp_path):
    overrides, scene, arrays = run
    own_labels = scene.noisy_labels[scene.rows(2)]

    def node_context() -> Context:
        # A restarted SuperNode: same node config, but an empty context.state.
        return Context(run_id=1, node_id=77, node_config={"partition-id": 2, "state-dir": str(tmp_path)},
                       state=RecordDict(), run_config={"overrides": overrides})

    # An instruction without a scope (outside a run's rounds) keeps the labels in memory only, even
    # on a node with a state-dir: nothing is written, and a restarted node has its own labels again.
    in_memory = node_context()
    assert correct(incoming, in_memory, arrays, mode="stage2", theta=0.0).n_relabeled > 0
    assert "fedcorr-labels" in in_memory.state.array_records
    assert not np.array_equal(labels_in(incoming, in_memory, None), own_labels)
    assert list(tmp_path.iterdir()) == []
    assert np.array_equal(labels_in(incoming, node_context(), None), own_labels)

    # A run's instruction (with a scope) keeps them on disk, as the version of its round.
    first = node_context()
    assert correct(incoming, first, arrays, StateScope(run="r1", round=1), mode="stage2", theta=0.0).n_relabeled > 0
    assert "fedcorr-labels" not in first.state.array_records, "on disk, not in context.state"
    corrected = current_labels(first, client_node.load_node(first))
    assert not np.array_equal(corrected, own_labels)
    saved = sorted(tmp_path.rglob("*.npz"))
    assert [p.relative_to(tmp_path).as_posix() for p in saved] == [
        "run-r1/partition-2/answered/r0000001-a1.npz", "run-r1/partition-2/fedcorr-labels/r0000001-a1.npz"]
    # A restarted node (fresh context.state) reads them back in the run's next round.
    assert np.array_equal(labels_in(incoming, node_context(), StateScope(run="r1", round=2)), corrected)
    # Another run on the same node starts from the node's own labels, not this run's corrections.
    assert np.array_equal(labels_in(incoming, node_context(), StateScope(run="r2", round=1)), own_labels)
    # A torn or foreign file is a clear error, not silently wrong labels.
    saved[1].write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="saved state .* is unreadable"):
        labels_in(incoming, node_context(), StateScope(run="r1", round=2))


def global_losses(node, arrays) -> np.ndarray:
    model = node.new_model()
    model.load_state_dict(arrays.to_torch_state_dict())
    return loss_and_proba(model, node.data.images, node.data.labels, node.eval_transform)[0]


def changed_rows(context: Context, node) -> set[int]:
    return set(np.flatnonzero(current_labels(context, node) != node.data.labels).tolist())


def test_stage1_training_keeps_the_trained_local_models_losses(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 5)
    reply = train_stage1(incoming, context, arrays, server_round=3)
    node = client_node.load_node(context)
    kept = load_local_losses(context, node, since_round=3)
    trained = ArrayRecord(reply.content["arrays"].to_torch_state_dict())
    np.testing.assert_allclose(kept, global_losses(node, trained), rtol=1e-5, atol=1e-6)
    assert not np.allclose(kept, global_losses(node, arrays)), "the local model, not the one it started from"
    # The losses stay on the client: only the weights travel as arrays, everything else is a scalar.
    assert set(reply.content.array_records) == {"arrays"}
    scalars = [value for record in [*reply.content.metric_records.values(), *reply.content.config_records.values()]
               for value in record.values()]
    assert scalars and all(isinstance(value, (int, float, str, bool)) for value in scalars)


def test_asked_for_it_stage1_training_returns_the_share_its_loss_gmm_finds_noisy(run, incoming, node_context):
    """The loss share is the kept losses' high-loss share, seeded as the correction's split: the mu_hat
    a stage-1 correction on those losses then estimates."""
    overrides, _, arrays = run
    context = node_context(overrides, 6)
    content = instruction(TrainIns(3, TRAINING, plugin="fedcorr"), arrays=arrays, plugin="fedcorr",
                          plugin_ins=Stage1Ins(lid_k=20, keep_losses=True, loss_share=True, seed=4))
    share = read_extra(client_app.train(incoming(content, "train"), context).content, "fedcorr", LidRes,
                       "client 6").loss_share
    node = client_node.load_node(context)
    kept = load_local_losses(context, node, since_round=3)
    assert share == pytest.approx(loss_split(kept, int(rng_for(4, "loss-gmm/6").integers(2**31))).mean())
    assert 0 < share < 1
    assert share == pytest.approx(correct(incoming, context, arrays, seed=4, relabel=False).mu_hat)
    unasked = read_extra(train_stage1(incoming, context, arrays).content, "fedcorr", LidRes, "client 6")
    assert unasked.loss_share is None


@pytest.fixture
def disagreeing(run, node_context):
    """A client whose kept local losses flag the samples the global model finds easiest: the 25% with
    the lowest global loss get high local losses, in the reverse order of their global losses."""
    overrides, _, arrays = run
    context = node_context(overrides, 6)
    node = client_node.load_node(context)
    by_global = np.argsort(global_losses(node, arrays), kind="stable")
    flagged = by_global[: len(by_global) // 4]  # ascending global loss
    local = np.full(len(by_global), 0.1, dtype=np.float32)
    local[flagged] = np.linspace(5.0, 6.0, flagged.size)  # the lowest global loss gets the lowest local loss
    store_local_losses(context, node, local, server_round=1)
    return context, node, arrays, flagged


def test_the_split_uses_the_losses_of_the_model_the_switch_names(disagreeing, incoming):
    context, node, arrays, flagged = disagreeing
    # pi = 1 and theta = 0: every sample of D_n takes the global argmax, so the changed labels lie in D_n.
    res = correct(incoming, context, arrays, pi=1.0, theta=0.0, split_losses="local")
    assert res.mu_hat == pytest.approx(flagged.size / len(node.data))
    assert changed_rows(context, node) and changed_rows(context, node) <= set(flagged.tolist())
    context.state.array_records.pop("fedcorr-labels")
    res = correct(incoming, context, arrays, pi=1.0, theta=0.0, split_losses="global")
    assert res.mu_hat != pytest.approx(flagged.size / len(node.data))
    assert changed_rows(context, node) and not changed_rows(context, node) & set(flagged.tolist())


def test_the_ranking_uses_the_losses_of_the_model_the_switch_names(disagreeing, incoming):
    context, node, arrays, flagged = disagreeing
    half = flagged.size // 2
    # flagged is in ascending global loss and ascending local loss: global ranking picks the last
    # half by global loss, local ranking the last half by local loss; the fixture makes these equal,
    # so reverse the local losses to make the two rankings pick disjoint halves.
    node_losses = load_local_losses(context, node, since_round=1).copy()
    node_losses[flagged] = node_losses[flagged][::-1]
    store_local_losses(context, node, node_losses, server_round=1)
    expected = {"global": set(flagged[-half:].tolist()), "local": set(flagged[:half].tolist())}
    assert half > 0 and not expected["global"] & expected["local"]
    for rank in ("global", "local"):
        context.state.array_records.pop("fedcorr-labels", None)
        correct(incoming, context, arrays, pi=0.5, theta=0.0, split_losses="local", rank_losses=rank)
        assert changed_rows(context, node) and changed_rows(context, node) <= expected[rank], rank


def test_a_split_on_missing_or_stale_local_losses_is_refused(run, incoming, node_context):
    overrides, _, arrays = run
    context = node_context(overrides, 7)
    with pytest.raises(RuntimeError, match="this node kept none"):
        correct(incoming, context, arrays)
    train_stage1(incoming, context, arrays, server_round=2)
    with pytest.raises(RuntimeError, match="from round 5 or later.*last stage-1 training was in round 2"):
        correct(incoming, context, arrays, losses_since=5)
    assert correct(incoming, context, arrays, losses_since=2).mu_hat is not None


def test_local_losses_survive_a_restarted_supernode_with_a_state_dir(run, incoming, tmp_path):
    overrides, _, arrays = run

    def node_context() -> Context:
        return Context(run_id=1, node_id=78, node_config={"partition-id": 8, "state-dir": str(tmp_path)},
                       state=RecordDict(), run_config={"overrides": overrides})

    trained = node_context()
    train_stage1(incoming, trained, arrays, scope=StateScope(run="r1", round=1))
    assert (tmp_path / "run-r1" / "partition-8" / "fedcorr-local-losses" / "r0000001-a1.npz").is_file()
    assert "fedcorr-local-losses" not in trained.state.array_records, "on disk, not in context.state"
    client_node._load_partition.cache_clear()
    client_node._scene.cache_clear()
    # A fresh process (empty context.state) finds the losses on disk in the run's next round; the
    # same split as in memory.
    restarted, again = node_context(), node_context()
    first = correct(incoming, restarted, arrays, StateScope(run="r1", round=2), relabel=False)
    assert first.mu_hat is not None
    assert first == correct(incoming, again, arrays, StateScope(run="r1", round=2), relabel=False)
    # Another run on the same node has no losses of its own to split on.
    with pytest.raises(RuntimeError, match="this node kept none"):
        correct(incoming, node_context(), arrays, StateScope(run="r2", round=1), relabel=False)


def test_the_confusion_counts_have_every_cell_even_for_classes_no_sample_holds():
    """Fig. 8's counts are M x M whatever labels occur: truth (0, 1, 1) held as (0, 0, 1) with M = 3
    fills cells (0,0), (1,0), (1,1) and leaves the six others, the whole last row and column among
    them, at 0; a sample of unknown truth (-1) counts nowhere."""
    truth = np.array([0, 1, 1, -1])
    held = np.array([0, 0, 1, 2])
    assert fedcorr_plugin.confusion(truth, held, 3) == (1, 0, 0, 1, 1, 0, 0, 0, 0)


def test_the_diagnostics_count_the_changed_labels_that_became_right():
    """changed_correct counts the labels the correction changed *and* made right: of four changed
    labels three now equal the truth, one went from one wrong label to another; an unchanged right
    label and an unknown truth count in neither."""
    truth = np.array([0, 1, 2, 0, 1, 2, -1])
    before = np.array([1, 2, 0, 1, 1, 2, 0])
    after = np.array([0, 1, 1, 0, 1, 2, 1])
    node = SimpleNamespace(data=SimpleNamespace(true_labels=truth), dataset=SimpleNamespace(num_classes=3))
    counts = fedcorr_plugin.diagnostics(node, before, after)  # type: ignore[arg-type]
    assert (counts.known, counts.wrong_before, counts.wrong_after) == (6, 4, 1)
    assert (counts.changed, counts.changed_correct) == (4, 3)
    assert counts.split_tp is None, "no split outside stage 1"


def test_the_plugin_answers_query_correct():
    """The plug-in registers its correction as the ``correct`` action, which the ClientApp serves as
    ``query.correct`` (the name the server sends)."""
    assert fedcorr_plugin.FedCorrPlugin().queries() == {"correct": fedcorr_plugin.correct}


def test_a_correction_without_arrays_is_refused_naming_the_server(run, incoming, node_context):
    """The global model is the server's: a query.correct without it says who sent the bad message."""
    overrides, _, _ = run
    content = instruction(CorrectIns(mode="stage2", pi=0.5, theta=0.5, split_losses="local", rank_losses="global"))
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing$"):
        client_app.app(incoming(content, "query.correct"), node_context(overrides, 0))


def test_stage1_training_reports_the_lid_with_the_instructions_k(run, incoming, node_context):
    """The LID score uses the k neighbours ``Stage1Ins.lid_k`` names (eq. 2), not the paper's default
    20: it equals ``lid_score`` with k = 3 of the trained model's softmax outputs on the local set."""
    overrides, _, arrays = run
    context = node_context(overrides, 1)
    reply = train_stage1(incoming, context, arrays, keep_losses=False, lid_k=3)
    node = client_node.load_node(context)
    model = node.new_model()
    model.load_state_dict(reply.content["arrays"].to_torch_state_dict())
    probabilities = loss_and_proba(model, node.data.images, node.data.labels, node.eval_transform)[1]
    expected = lid_score(probabilities, k=3)
    assert expected != pytest.approx(lid_score(probabilities, k=20)), "k must matter for this check to mean anything"
    assert read_extra(reply.content, "fedcorr", LidRes, "client 1").lid == pytest.approx(expected, rel=1e-6)


def spy_devices(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The devices the plug-in hands its evaluation passes (None: none given, so the pass runs on the CPU)."""
    devices: list[object] = []

    def spying(*args, **kwargs):
        devices.append(kwargs.get("device"))
        return loss_and_proba(*args, **kwargs)

    monkeypatch.setattr(fedcorr_plugin, "loss_and_proba", spying)
    return devices


def test_the_lid_and_correction_passes_run_on_the_nodes_device(run, incoming, node_context, monkeypatch):
    """The model lives on the node's device (``client.device``), so both passes over the local set (after
    stage-1 training, and the correction's) must run there: on a GPU node a pass on the CPU default
    would fail on the model's CUDA weights."""
    overrides, _, arrays = run
    context = node_context(overrides, 9)
    node = client_node.load_node(context)
    devices = spy_devices(monkeypatch)
    train_stage1(incoming, context, arrays, keep_losses=False)
    correct(incoming, context, arrays, mode="stage2")
    assert devices == [node.device, node.device]


def test_the_loss_split_is_seeded_from_the_runs_seed_and_the_partition(run, incoming, node_context):
    """The client's loss GMM takes scikit-learn's random_state from the named stream ``loss-gmm/<partition>``
    of the run's seed (a value below 2^31), so a run's split is reproducible and another seed may split
    otherwise. The kept losses are five equal, evenly spaced groups: a 2-component GMM splits them
    2:3 or 3:2 depending on its start, so mu_hat (|D_n| / n) shows which start it had."""
    overrides, _, arrays = run
    context = node_context(overrides, 6)
    node = client_node.load_node(context)
    n = len(node.data)
    local = (np.arange(n) * 5 // n).astype(np.float32)
    store_local_losses(context, node, local, server_round=1)
    outcomes = set()
    for seed in range(8):
        expected = loss_split(local, int(rng_for(seed, "loss-gmm/6").integers(2**31))).mean()
        outcomes.add(round(float(expected), 6))
        assert correct(incoming, context, arrays, seed=seed, relabel=False).mu_hat == pytest.approx(expected), seed
    assert len(outcomes) == 2, "the seeds must lead to both splits for this check to mean anything"
