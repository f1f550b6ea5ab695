"""FedNoRo: its maths on hand-computed inputs (per-class losses, normalisation, voting, lambda's
ramp, the distance weights, the logit-adjusted distillation), its settings, and whole in-process runs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from defaults import local_training

from client.plugins.fednoro import per_class_losses
from common.errors import ConfigError
from protocol.codec import ProtocolError, decode, encode
from protocol.fednoro import ClassLossIns, ClassLossRes, FedNoRoIns
from strategies.fednoro import daagg_weights, kd_weight_at, state_distance
from strategies.fednoro_detection import normalised_class_losses, voted_noisy_rows
from task.learners import Batch
from task.learners.logit_adjusted import LogitAdjustedDistillation, class_log_prior, distillation


def test_per_class_losses_average_each_class_and_mark_missing_ones():
    losses, labels = np.array([1.0, 3.0, 0.5, 2.0, 0.5]), np.array([0, 0, 2, 2, 2])
    res = per_class_losses(losses, labels, num_classes=3)
    assert res.present == (1, 0, 1) and res.counts is None
    assert res.losses == pytest.approx((2.0, 0.0, 1.0))
    counted = per_class_losses(losses, labels, num_classes=3, counts=True)
    assert counted.counts == (2, 0, 3) and counted.present is None and counted.losses == res.losses
    assert counted.presence() == res.presence() == (1, 0, 1)


def test_class_losses_travel_as_float_and_integer_lists():
    res = ClassLossRes(losses=(2.0, 0.0, 1.25), present=(1, 0, 1))
    record = encode(res)
    assert record == {"present": [1, 0, 1], "losses": [2.0, 0.0, 1.25]}
    assert decode(ClassLossRes, record, "client 1") == res
    assert encode(ClassLossRes(losses=(2.0, 0.0, 1.25), counts=(4, 0, 2))) == {"counts": [4, 0, 2],
                                                                              "losses": [2.0, 0.0, 1.25]}
    # A whole number in a float vector is fine; a string or a bool is not.
    assert decode(ClassLossRes, {**record, "losses": [2, 0, 1]}, "client 1").losses == (2.0, 0.0, 1.0)
    with pytest.raises(ProtocolError, match="key 'losses' holds \\['a'\\]: expected a list of numbers"):
        decode(ClassLossRes, {**record, "losses": ["a"]}, "client 1")


@pytest.mark.parametrize("record, counts, message", [
    ({"losses": [1.0, 2.0], "present": [1, 1]}, False, None),
    ({"losses": [1.0, 2.0], "counts": [3, 0]}, True, None),
    ({"losses": [1.0, 2.0], "counts": [3, 0]}, False, "key 'present' is missing"),
    ({"losses": [1.0, 2.0], "present": [1, 0]}, True, "key 'counts' is missing"),
    ({"losses": [1.0, 2.0], "present": [1, 0], "counts": [3, 0]}, False, "key 'counts' was not asked for"),
    ({"losses": [1.0, 2.0], "present": [1, 2]}, False, "key 'present' must be one 0 or 1 per class loss"),
    ({"losses": [1.0, 2.0], "counts": [3]}, True, "key 'counts' must be one count >= 0 per class loss"),
])
def test_the_server_takes_only_the_class_presence_it_asked_for(record, counts, message):
    from flwr.app import MetricRecord, RecordDict

    from strategies.fednoro import read_class_losses

    content = RecordDict({"metrics": MetricRecord(record)})
    if message is None:
        assert read_class_losses(content, "client 1", counts).presence() == (1, int(not counts))
    else:
        with pytest.raises(ProtocolError, match=message):
            read_class_losses(content, "client 1", counts)


def test_missing_classes_count_as_clean_and_columns_are_min_max_normalised():
    losses = np.array([[1.0, 0.0, 5.0],
                       [3.0, 2.0, 5.0],
                       [2.0, 4.0, 5.0]])
    counts = np.array([[1, 0, 3], [1, 1, 3], [1, 1, 3]])
    matrix = normalised_class_losses(losses, counts)
    # column 0: (x - 1) / 2; column 1: client 0 lacks the class -> the column's minimum 2 -> 0;
    # column 2 is constant -> 0.
    np.testing.assert_allclose(matrix, [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 1.0, 0.0]])


def test_whole_number_losses_scale_to_fractions_and_a_class_nobody_has_is_zero():
    # Column 0: no client has the class, nothing to scale -> 0, and the next column is still scaled;
    # column 1's integer losses 1, 3, 2 -> (x - 1) / 2, the half included.
    losses = np.array([[0, 1], [0, 3], [0, 2]])
    present = np.array([[0, 1], [0, 1], [0, 1]])
    np.testing.assert_array_equal(normalised_class_losses(losses, present), [[0.0, 0.0], [0.0, 1.0], [0.0, 0.5]])


def test_the_vote_finds_the_high_loss_clients_and_reports_agreement():
    rng = np.random.default_rng(0)
    clean = rng.normal(0.1, 0.03, size=(12, 4))
    noisy = rng.normal(0.8, 0.03, size=(5, 4))
    matrix = np.vstack([clean, noisy])
    rows, agreement = voted_noisy_rows(matrix, seeds=list(range(9)))
    assert rows == tuple(range(12, 17))
    assert agreement == 1.0
    # Identical rows carry no split.
    assert voted_noisy_rows(np.ones((5, 3)), seeds=[0, 1]) == ((), 1.0)


def test_two_clients_and_one_class_split_and_each_fit_is_seeded_with_its_own_seed(monkeypatch):
    import sklearn.mixture

    seeds = []
    mixture = sklearn.mixture.GaussianMixture

    def recorded(**options):
        seeds.append(options.get("random_state"))
        return mixture(**options)

    monkeypatch.setattr(sklearn.mixture, "GaussianMixture", recorded)
    # Two distinct clients are enough for a split: each is a component, the higher loss is noisy.
    assert voted_noisy_rows(np.array([[0.0], [1.0]]), seeds=[0, 1, 2, 3, 4, 5]) == ((1,), 1.0)
    assert seeds == [0, 1, 2, 3, 4, 5], "every fit takes its own seed, so a vote can be repeated"


def test_the_distillation_weight_ramps_from_the_warm_up_to_its_ceiling():
    # b = 10, e = 49, a = 0.8 (the released code's schedule for 100 rounds).
    assert kd_weight_at(5, 0.8, 10, 49) == pytest.approx(0.8 * math.exp(-5))
    assert kd_weight_at(10, 0.8, 10, 49) == pytest.approx(0.8 * math.exp(-5))
    assert kd_weight_at(29, 0.8, 10, 49) == pytest.approx(0.8 * math.exp(-5 * (1 - 19 / 39) ** 2))
    assert kd_weight_at(49, 0.8, 10, 49) == pytest.approx(0.8)
    assert kd_weight_at(90, 0.8, 10, 49) == pytest.approx(0.8)


def test_state_distance_sums_per_tensor_norms_and_skips_integer_buffers():
    a = {"w": np.array([3.0, 0.0], np.float32), "b": np.array([0.0], np.float32), "n": np.array(7, np.int64)}
    b = {"w": np.array([0.0, 4.0], np.float32), "b": np.array([12.0], np.float32), "n": np.array(1, np.int64)}
    assert state_distance(a, b, a.keys(), per_tensor=True) == pytest.approx(5.0 + 12.0)
    assert state_distance(a, b, a.keys(), per_tensor=False) == pytest.approx(13.0)
    assert state_distance(a, b, ["w"], per_tensor=True) == pytest.approx(5.0)


def test_daagg_down_weights_noisy_clients_by_their_distance_to_the_nearest_clean_one():
    states = [{"w": np.array([0.0])}, {"w": np.array([1.0])}, {"w": np.array([3.0])}, {"w": np.array([6.0])}]
    sizes = [10.0, 10.0, 20.0, 10.0]
    noisy = [False, False, True, True]
    weights = daagg_weights(states, sizes, noisy, ["w"])
    # d = (0, 0, 2, 5) -> D = (0, 0, 0.4, 1); raw = n * exp(-D).
    raw = np.array([10.0, 10.0, 20.0 * math.exp(-0.4), 10.0 * math.exp(-1.0)])
    np.testing.assert_allclose(weights, raw / raw.sum())
    # All clean or all noisy: plain FedAvg weights.
    np.testing.assert_allclose(daagg_weights(states, sizes, [True] * 4, ["w"]), np.array(sizes) / 50)
    np.testing.assert_allclose(daagg_weights(states, sizes, [False] * 4, ["w"]), np.array(sizes) / 50)


def test_the_log_prior_is_minus_infinity_for_an_absent_class_unless_floored():
    prior = class_log_prior(np.array([0, 0, 0, 1]), 3)
    assert prior[0].item() == pytest.approx(math.log(0.75)) and prior[2].item() == -math.inf
    assert class_log_prior(np.array([0, 0, 0, 1]), 3, floor=1e-8)[2].item() == pytest.approx(math.log(1e-8))


def test_the_log_prior_takes_labels_stored_as_floats_and_log_zero_raises_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -inf for the absent class is meant: no divide-by-zero warning
        prior = class_log_prior(np.array([0.0, 0.0, 1.0, 1.0]), 3)
    assert prior[:2].tolist() == pytest.approx([math.log(0.5)] * 2) and prior[2].item() == -math.inf


class _Fixed(torch.nn.Module):
    """A 'network' that returns fixed logits (plus 0 * x so gradients flow)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits + 0 * x.sum()


def _batch(labels: list[int]) -> Batch:
    return Batch(torch.zeros(len(labels), 1, 2, 2, dtype=torch.uint8), torch.tensor(labels),
                 lambda images, generator=None: images.float(), torch.Generator())


def test_the_logit_adjusted_loss_shifts_logits_by_tau_log_prior():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    log_prior = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    loss = LogitAdjustedDistillation(log_prior, tau=1.0)(_Fixed(logits), _batch([0, 2]))
    expected = F.cross_entropy(logits + log_prior, torch.tensor([0, 2]))
    assert loss.objective.item() == pytest.approx(expected.item())
    assert loss.reported.item() == pytest.approx(expected.item())


def test_noisy_clients_mix_the_adjusted_loss_with_distillation_from_the_teacher():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    teacher_logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    log_prior = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    loss = LogitAdjustedDistillation(log_prior, 1.0, _Fixed(teacher_logits), kd_weight=0.3, temperature=0.8)(
        _Fixed(logits), _batch([0, 2]))
    adjusted = logits + log_prior
    ce = F.cross_entropy(adjusted, torch.tensor([0, 2]))
    target = torch.softmax(teacher_logits / 0.8, dim=1)
    kl = (target * (target.log() - torch.log_softmax(adjusted, dim=1))).sum(dim=1).mean()
    assert loss.objective.item() == pytest.approx((0.7 * ce + 0.3 * kl).item(), rel=1e-5)
    assert loss.reported.item() == pytest.approx(ce.item())


def test_a_teacher_without_a_kd_weight_is_never_run_and_the_default_temperature_is_one():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    teacher_logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    log_prior = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    adjusted = logits + log_prior
    ce = F.cross_entropy(adjusted, torch.tensor([0, 2]))
    teacher, calls = _Fixed(teacher_logits), []
    teacher.register_forward_hook(lambda *_: calls.append(1))
    loss = LogitAdjustedDistillation(log_prior, 1.0, teacher)(_Fixed(logits), _batch([0, 2]))
    assert loss.objective.item() == pytest.approx(ce.item()) and calls == [], "kd_weight 0 by default"
    # kd_weight 0.5 at the default T = 1: the teacher's plain softmax is the target.
    target = torch.softmax(teacher_logits, dim=1)
    kl = (target * (target.log() - torch.log_softmax(adjusted, dim=1))).sum(dim=1).mean()
    mixed = LogitAdjustedDistillation(log_prior, 1.0, teacher, kd_weight=0.5)(_Fixed(logits), _batch([0, 2]))
    assert mixed.objective.item() == pytest.approx((0.5 * ce + 0.5 * kl).item(), rel=1e-5) and calls == [1]


def test_tau_zero_leaves_the_logits_alone_even_with_an_absent_class():
    # Class 1 is absent (log prior -inf), and 0 * -inf is nan: tau = 0 is a plain cross-entropy.
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    log_prior = class_log_prior(np.array([0, 0, 2]), 3)
    loss = LogitAdjustedDistillation(log_prior, tau=0.0)(_Fixed(logits), _batch([0, 2]))
    assert loss.objective.item() == pytest.approx(F.cross_entropy(logits, torch.tensor([0, 2])).item())


def test_the_prior_shift_follows_the_batch_to_its_device():
    # The log prior is built on the CPU; the meta device stands in for a GPU: an operation that mixes
    # it with a CPU tensor fails, as CUDA's does.
    batch = Batch(torch.zeros(2, 1, 2, 2, dtype=torch.uint8, device="meta"), torch.tensor([0, 2], device="meta"),
                  lambda images, generator=None: images.float(), torch.Generator())
    model = _Fixed(torch.zeros(2, 3, device="meta"))
    loss = LogitAdjustedDistillation(torch.log(torch.tensor([0.5, 0.25, 0.25])), tau=1.0)(model, batch)
    assert loss.objective.device.type == "meta"


def test_an_absent_class_cannot_make_the_distillation_infinite():
    adjusted = torch.tensor([[1.0, -math.inf, 0.0]])
    teacher = torch.tensor([[0.0, 1.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both softmaxes name the class dimension: no implicit-dim warning
        value = distillation(adjusted, teacher, 1.0)
    assert torch.isfinite(value)
    target = torch.softmax(teacher, dim=1)
    log_student = torch.log_softmax(adjusted, dim=1)
    log_student[0, 1] = 0.0
    assert value.item() == pytest.approx((target * (target.log() - log_student)).sum().item())


def test_options_are_checked():
    with pytest.raises(Exception, match="kd_weight=1.5 is invalid"):
        FedNoRoIns(noisy=True, kd_weight=1.5, temperature=0.8, la_tau=1.0, absent_classes="neg_inf")


@pytest.mark.parametrize(("overrides", "message"), [
    ("strategy.warmup=10", r"strategy.warmup=10 is invalid: allowed is fewer than the run's 10 rounds"),
    ("strategy.warmup=4", r"strategy.warmup=4 is invalid: the distillation weight's ramp ends at round 4"),
    ("strategy.train.learner=sce", r"strategy.train.learner=sce is invalid: fednoro trains with learner ce"),
    ("strategy.distance=cosine", r"strategy.distance='cosine' is invalid: allowed are per_tensor, global_l2"),
    ("strategy.gmm_runs=0", r"strategy.gmm_runs=0 is invalid"),
])
def test_bad_settings_are_one_clear_error(overrides, message):
    from server.config import load_run
    from settings.compose import compose_config

    with pytest.raises(ConfigError, match=message):
        load_run(compose_config(["experiment=smoke", "strategy=fednoro", *overrides.split()]))


def test_a_smoke_run_warms_up_detects_noisy_clients_better_than_chance_and_distils(run_inprocess):
    payload, _ = run_inprocess("experiment=smoke strategy=fednoro strategy.warmup=3")
    stages = [row["stage"] for row in payload["rounds"]]
    assert stages == ["warmup"] * 3 + ["distill"] * 7
    block = payload["fednoro"]
    assert block["detected_after_round"] == 3 and block["class_loss_queries"] == 10
    truth = set(block["true_noisy_clients"])
    detected = set(block["detected_noisy_clients"])
    assert truth and 0 < len(detected) < 10
    # Better than chance: the detected set holds a larger share of noisy clients than the federation.
    assert len(detected & truth) / len(detected) > len(truth) / 10
    assert block["detection"]["f1"] == pytest.approx(
        2 * len(detected & truth) / (len(detected) + len(truth)))
    assert payload["summary"]["comm_cost"] == 30
    assert [d["after_round"] for d in block["detections"]] == [3]


def test_counts_or_the_present_class_mask_give_the_same_detection_and_run(run_inprocess, tmp_path):
    """The detection reads which classes a client has, nothing more: the same run with per-class
    counts instead of the mask detects the same clients by the same scores and ends identically."""
    overrides = "experiment=smoke strategy=fednoro strategy.num_rounds=6 strategy.warmup=2 strategy.redetect_every=2"
    overrides += " strategy.kd_ramp_end=end strategy.train.epochs=1"  # two runs' equality: one epoch shows it
    masked, _ = run_inprocess(f"{overrides} out_dir={tmp_path / 'mask'}")
    counted, _ = run_inprocess(f"{overrides} strategy.detect_counts=true out_dir={tmp_path / 'counts'}")
    block = masked["fednoro"]
    assert len(block["detections"]) == 2 and block["detection"] is not None
    assert 0 < len(block["detected_noisy_clients"]) < 10
    assert block == counted["fednoro"]
    assert [row["test_acc"] for row in masked["rounds"]] == [row["test_acc"] for row in counted["rounds"]]
    assert (tmp_path / "mask" / "fednoro_clients.csv").read_text() == (
        tmp_path / "counts" / "fednoro_clients.csv").read_text()


def test_redetection_repeats_the_query_every_r_rounds_and_replaces_the_noisy_set(run_inprocess):
    payload, _ = run_inprocess("experiment=smoke strategy=fednoro strategy.warmup=3 strategy.redetect_every=2 "
                               "strategy.train.epochs=1")  # the schedule: one local epoch shows it
    block = payload["fednoro"]
    assert [d["after_round"] for d in block["detections"]] == [3, 5, 7, 9]
    assert block["class_loss_queries"] == 40 and payload["summary"]["comm_cost"] == 30
    last = block["detections"][-1]
    assert last["noisy_clients"] == len(block["detected_noisy_clients"])
    assert last["detection"] == block["detection"] and 0.0 < last["vote_agreement"] <= 1.0


def test_a_client_keeps_no_state_a_recreated_node_trains_identically(prepared_run, incoming):
    """FedNoRo's role and lambda come with every message: a fresh node process (an empty context)
    gives the same update as one that has trained before, and the class losses travel once."""
    from flwr.app import Context, RecordDict

    from client import app as client_app
    from protocol.messages import TrainIns, instruction, read_arrays, read_reply

    overrides, scene, arrays = prepared_run("experiment=smoke strategy=fednoro")

    def context() -> Context:
        return Context(run_id=1, node_id=77, node_config={"partition-id": 3}, state=RecordDict(),
                       run_config={"overrides": overrides})

    def train(ctx: Context, server_round: int):
        options = FedNoRoIns(noisy=True, kd_weight=0.4, temperature=0.8, la_tau=1.0, absent_classes="neg_inf")
        content = instruction(TrainIns(server_round, local_training(lr=0.05, epochs=1, batch_size=16),
                                       plugin="fednoro"), arrays=arrays, plugin_ins=options, plugin="fednoro")
        return read_arrays(client_app.train(incoming(content, "train"), ctx).content, "client 3").to_torch_state_dict()

    used = context()
    train(used, 1)
    again, fresh = train(used, 2), train(context(), 2)
    assert all(torch.equal(again[key], fresh[key]) for key in again)
    assert len(used.state.array_records) == 0, "nothing is kept between rounds"
    def query(transform: str, server_round: int = 4, counts: bool = False) -> ClassLossRes:
        content = instruction(ClassLossIns(transform, server_round, counts=counts), arrays=arrays)
        return read_reply(client_app.app(incoming(content, "query.class_loss"), context()).content, ClassLossRes,
                          "client 3")

    losses, counted = query("eval"), query("eval", counts=True)
    labels = scene.noisy_labels[scene.rows(3)]
    assert counted.counts == tuple(int(c) for c in np.bincount(labels, minlength=10))
    assert losses.present == tuple(int(c > 0) for c in counted.counts) and losses.counts is None
    assert losses.losses == counted.losses
    assert all(loss > 0 for loss, present in zip(losses.losses, losses.present) if present)
    # Digits train without augmentation: the training transform scores as the evaluation one.
    assert query("train") == losses


def test_the_detection_query_can_score_one_seeded_draw_of_the_training_augmentation(prepared_run, incoming):
    from flwr.app import Context, RecordDict

    from client import app as client_app
    from protocol.messages import instruction, read_reply

    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro +dataset.transforms.train.crop=8 "
                                        "+dataset.transforms.train.pad=1")

    def query(transform: str, server_round: int = 4) -> ClassLossRes:
        context = Context(run_id=1, node_id=77, node_config={"partition-id": 3}, state=RecordDict(),
                          run_config={"overrides": overrides})
        content = instruction(ClassLossIns(transform, server_round), arrays=arrays)
        return read_reply(client_app.app(incoming(content, "query.class_loss"), context).content, ClassLossRes,
                          "client 3")

    plain, augmented = query("eval"), query("train")
    assert augmented.present == plain.present and augmented.losses != plain.losses
    assert query("train") == augmented and query("train", server_round=5) != augmented


def test_per_class_losses_keep_a_single_sample_class_and_absent_classes_at_the_end():
    """A class with one sample is present with that sample's loss as its mean; classes above the largest
    label still get their 0.0 loss and their 0 in the mask (or count), so the reply has one entry per class."""
    losses, labels = np.array([0.7, 1.0, 3.0]), np.array([1, 0, 0])
    res = per_class_losses(losses, labels, num_classes=4)
    assert res.losses == pytest.approx((2.0, 0.7, 0.0, 0.0)) and res.present == (1, 1, 0, 0)
    assert per_class_losses(losses, labels, num_classes=4, counts=True).counts == (2, 1, 0, 0)


def test_per_class_losses_take_labels_stored_as_floats_and_losses_of_any_real_dtype():
    """Labels kept as floats count as the classes they name (as ``class_log_prior`` takes them), and
    losses in numpy's extended precision are averaged as float64 (np.bincount itself refuses both)."""
    res = per_class_losses(np.array([1.0, 3.0, 0.5], dtype=np.longdouble), np.array([0.0, 0.0, 2.0]), num_classes=3)
    assert res.losses == pytest.approx((2.0, 0.0, 0.5)) and res.present == (1, 0, 1)
    assert all(type(loss) is float for loss in res.losses)


def test_the_plugin_answers_query_class_loss():
    """The plug-in registers the detection as the ``class_loss`` action, which the ClientApp serves as
    ``query.class_loss`` (the name the server sends)."""
    from client.plugins import fednoro as fednoro_plugin

    assert fednoro_plugin.FedNoRoPlugin().queries() == {"class_loss": fednoro_plugin.class_loss}


def test_the_teacher_is_the_sent_model_frozen_in_evaluation_mode(prepared_run, node_context):
    """The distillation's teacher holds the state it is given, evaluates (eval mode) and takes no
    gradients: only the student trains."""
    from client import node as client_node
    from client.plugins.fednoro import frozen_model

    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro")
    state = arrays.to_torch_state_dict()
    teacher = frozen_model(client_node.load_node(node_context(overrides, 3)), state)
    assert not teacher.training
    assert all(not param.requires_grad for param in teacher.parameters())
    assert all(torch.equal(value, state[key]) for key, value in teacher.state_dict().items())


def _logit_adjusted(noisy: bool, kd_weight: float, temperature: float, la_tau: float,
                    absent_classes: str = "neg_inf") -> FedNoRoIns:
    return FedNoRoIns(noisy=noisy, kd_weight=kd_weight, temperature=temperature, la_tau=la_tau,
                      absent_classes=absent_classes)


def test_the_hooks_train_on_the_instructions_tau_lambda_and_temperature():
    """``LogitAdjusted``'s learner is the loss with the instruction's tau, lambda and T and the given
    teacher: its value on fixed logits is (1 - lambda) CE + lambda KL, built by hand as in the tests above."""
    from client.plugins.fednoro import LogitAdjusted

    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    teacher_logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    log_prior = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    ins = _logit_adjusted(noisy=True, kd_weight=0.3, temperature=0.5, la_tau=2.0)
    hooks = LogitAdjusted(local_training(), None, ins, log_prior, _Fixed(teacher_logits))
    loss = hooks.learner(_Fixed(logits), torch.Generator())(_Fixed(logits), _batch([0, 2]))
    adjusted = logits + 2.0 * log_prior
    ce = F.cross_entropy(adjusted, torch.tensor([0, 2]))
    target = torch.softmax(teacher_logits / 0.5, dim=1)
    kl = (target * (target.log() - torch.log_softmax(adjusted, dim=1))).sum(dim=1).mean()
    assert loss.objective.item() == pytest.approx((0.7 * ce + 0.3 * kl).item(), rel=1e-5)
    assert loss.reported.item() == pytest.approx(ce.item(), rel=1e-6)


def _train_fednoro(overrides: str, context, arrays, options: FedNoRoIns, server_round: int = 1):
    """One FedNoRo local update (one epoch) of the node of ``context`` from ``arrays``: the trained state."""
    from client import node as client_node
    from client.plugins.fednoro import FedNoRoPlugin
    from protocol.messages import TrainIns, instruction

    ins = TrainIns(server_round, local_training(lr=0.05, epochs=1, batch_size=16), plugin="fednoro")
    content = instruction(ins, arrays=arrays, plugin_ins=options, plugin="fednoro")
    trained = FedNoRoPlugin().train(client_node.load_node(context), context, ins, content)
    return trained.model.state_dict()


def test_a_class_the_client_lacks_gets_no_gradient_unless_its_prior_is_floored(prepared_run, node_context):
    """The log prior comes from the client's current labels. With ``neg_inf`` a class it lacks has
    adjusted logit -inf, softmax 0 and so exactly zero gradient: its classifier row stays as sent. With
    ``floor`` (pi = 1e-8; tau 0.1 makes that shift only -1.8) the class keeps some probability, so its
    row is pushed down."""
    from client import node as client_node
    from client.label_state import store_labels

    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro")
    start = arrays.to_torch_state_dict()

    def relabelled_context():
        context = node_context(overrides, 3)
        node = client_node.load_node(context)
        labels = node.data.labels.copy()
        assert (labels == 4).any(), "the class must be there to be taken away"
        labels[labels == 4] = 5  # the client's current labels lack class 4
        store_labels(context, node, labels)
        return context

    for absent_classes, kept in (("neg_inf", True), ("floor", False)):
        options = _logit_adjusted(noisy=False, kd_weight=0.0, temperature=0.8, la_tau=0.1,
                                  absent_classes=absent_classes)
        trained = _train_fednoro(overrides, relabelled_context(), arrays, options)
        for key in ("classifier.3.weight", "classifier.3.bias"):
            assert torch.equal(trained[key][4], start[key][4]) == kept, (absent_classes, key)
            assert not torch.equal(trained[key][5], start[key][5]), "a present class trains"


def test_a_noisy_client_distils_the_global_model_and_a_clean_one_ignores_lambda(prepared_run, node_context):
    """With lambda = 1, T = 1 and tau = 0 a noisy client's whole objective is KL(softmax(f_G) ||
    softmax(f)), and the teacher f_G is the model it starts from: the gradient is zero and the weights
    stay put (up to rounding). A clean client never distils: lambda = 1 trains exactly as lambda = 0,
    on the cross-entropy, which moves the weights."""
    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro")
    start = arrays.to_torch_state_dict()

    def train(noisy: bool, kd_weight: float):
        options = _logit_adjusted(noisy=noisy, kd_weight=kd_weight, temperature=1.0, la_tau=0.0)
        return _train_fednoro(overrides, node_context(overrides, 3), arrays, options)

    distilled = train(True, 1.0)
    assert all(torch.allclose(distilled[key], start[key], rtol=0.0, atol=1e-6) for key in start)
    clean, plain = train(False, 1.0), train(False, 0.0)
    assert all(torch.equal(clean[key], plain[key]) for key in start)
    assert max((clean[key] - start[key]).abs().max().item() for key in start) > 1e-3


def test_each_round_trains_on_its_own_draw_of_the_batches(prepared_run, node_context):
    """The batch order comes from the node's stream for the round: the same start and instruction in
    another round give another update (a stateless client must not replay one order every round)."""
    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro")
    options = _logit_adjusted(noisy=False, kd_weight=0.0, temperature=0.8, la_tau=1.0)
    first, second = (_train_fednoro(overrides, node_context(overrides, 3), arrays, options, server_round=r)
                     for r in (1, 2))
    assert not all(torch.equal(first[key], second[key]) for key in first)


def test_fednoro_messages_without_arrays_are_refused_naming_the_server(prepared_run, node_context):
    """The global model is the server's: a train or query.class_loss without it says who sent the bad message."""
    from client import node as client_node
    from client.plugins.fednoro import FedNoRoPlugin, class_loss
    from protocol.codec import ProtocolError
    from protocol.messages import TrainIns, instruction

    overrides, _, _ = prepared_run("experiment=smoke strategy=fednoro")
    context = node_context(overrides, 3)
    node = client_node.load_node(context)
    ins = TrainIns(1, local_training(epochs=1), plugin="fednoro")
    content = instruction(ins, plugin_ins=_logit_adjusted(False, 0.0, 0.8, 1.0), plugin="fednoro")
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing$"):
        FedNoRoPlugin().train(node, context, ins, content)
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing$"):
        class_loss(node, context, instruction(ClassLossIns("eval", 4)))


def test_the_detection_passes_run_on_the_nodes_device(prepared_run, node_context, monkeypatch):
    """The model lives on the node's device (``client.device``), so the detection's pass over the local
    set must run there, on either transform: on a GPU node a pass on the CPU default would fail on the
    model's CUDA weights."""
    from client import node as client_node
    from client.plugins import fednoro as fednoro_plugin
    from protocol.messages import instruction

    devices: list[object] = []

    def spying(forward):
        def spy(*args, **kwargs):
            devices.append(kwargs.get("device"))
            return forward(*args, **kwargs)
        return spy

    monkeypatch.setattr(fednoro_plugin, "predict_logits", spying(fednoro_plugin.predict_logits))
    monkeypatch.setattr(fednoro_plugin, "augmented_logits", spying(fednoro_plugin.augmented_logits))
    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro")
    context = node_context(overrides, 3)
    for transform in ("eval", "train"):
        fednoro_plugin.class_loss(client_node.load_node(context), context,
                                  instruction(ClassLossIns(transform, 4), arrays=arrays))
    assert devices == [client_node.load_node(context).device] * 2


def test_the_augmented_detection_draws_from_the_nodes_own_detection_stream(prepared_run, node_context):
    """``detect_transform=train`` scores one draw of the augmentation from the node's stream named
    ``fednoro-detection`` for the round (run seed, partition, round): not the stream its training of
    that round shuffles and augments with, and the same in every version for a given run."""
    from client import node as client_node
    from client.plugins.fednoro import class_loss
    from protocol.messages import instruction, read_reply
    from task.evaluation import augmented_logits, per_sample_losses

    overrides, _, arrays = prepared_run("experiment=smoke strategy=fednoro +dataset.transforms.train.crop=8 "
                                        "+dataset.transforms.train.pad=1")
    context = node_context(overrides, 3)
    node = client_node.load_node(context)
    reply = read_reply(class_loss(node, context, instruction(ClassLossIns("train", 4), arrays=arrays)),
                       ClassLossRes, "client 3")
    model = node.new_model()
    model.load_state_dict(arrays.to_torch_state_dict())

    def scored(purpose: str) -> ClassLossRes:
        logits = augmented_logits(model, node.data.images, node.train_transform, node.generator(4, purpose))
        return per_class_losses(per_sample_losses(logits, node.data.labels), node.data.labels, 10)

    assert reply == scored("fednoro-detection")
    assert reply.losses != scored("train").losses
