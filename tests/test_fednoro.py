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


# --- the strategy itself: schedule, roles, detection, DaAgg and its report, on a stand-in grid ---------------

_NODES = {pid: 500 + pid for pid in range(6)}
# Per client the 2-class detection reply: clients 3 and 4 have high losses; client 5 lacks class 1.
_LOSSES = {0: (0.1, 0.2), 1: (0.2, 0.1), 2: (0.1, 0.1), 3: (0.9, 0.8), 4: (0.8, 0.9), 5: (0.2, 0.0)}


class _ClassLossGrid:
    """A stand-in grid: every ``query.class_loss`` is answered with the client's entry of ``losses``
    (its mask marks the classes whose loss is not 0.0); the instructions are kept in ``queries``."""

    def __init__(self, losses: dict[int, tuple[float, ...]]) -> None:
        self.losses = losses
        self.queries: list[tuple[int, ClassLossIns]] = []

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Message, Metadata

        from protocol.messages import read_instruction, reply

        answers = []
        for message in messages:
            node = message.metadata.dst_node_id
            pid = {n: p for p, n in _NODES.items()}[node]
            self.queries.append((pid, read_instruction(message.content, ClassLossIns)))
            losses = self.losses[pid]
            res = ClassLossRes(losses=losses, present=tuple(int(x > 0) for x in losses))
            metadata = Metadata(run_id=1, message_id="", src_node_id=node, dst_node_id=0, reply_to_message_id="",
                                group_id="", created_at=0.0, ttl=60.0, message_type=message.metadata.message_type)
            answers.append(Message(content=reply(res), metadata=metadata))
        return answers


def _strategy(truth=None, parameter_names: tuple[str, ...] = ("w",), **changes):
    """FedNoRo over the six clients of ``_NODES`` (10 samples each), 10 rounds, 2 warm-up rounds
    unless ``changes`` say otherwise."""
    from defaults import context, strategy_settings

    from strategies.federation import Federation
    from strategies.fednoro import FedNoRo

    settings = strategy_settings("fednoro", **{"num_rounds": 10, "fraction": 0.5, "warmup": 2, **changes})
    strategy = FedNoRo(settings, context(num_clients=6, truth=truth, parameter_names=parameter_names))
    strategy.bind(Federation(node_of=dict(_NODES), num_examples=dict.fromkeys(_NODES, 10)))
    return strategy


def _truth(noisy: set[int]):
    from strategies.ground_truth import GroundTruth

    return GroundTruth(noisy_clients=frozenset(noisy), true_noise={p: 0.5 * (p in noisy) for p in _NODES},
                       sizes=dict.fromkeys(_NODES, 10), known=dict.fromkeys(_NODES, 10))


def _round(strategy, grid: _ClassLossGrid, server_round: int) -> None:
    """The server's configure step of ``server_round`` (the strategy's round ``server_round - 1``)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    strategy.stage_rounds = server_round - 1
    strategy.configure_train(server_round, ArrayRecord({"w": Array(np.array([1.0, 2.0], np.float32))}),
                             ConfigRecord(), grid)


def test_the_report_before_any_detection_names_no_noisy_client_and_no_vote(flower_identity):
    """Before the detection results.json's block says so: no round, no agreement, no query, every
    client unscored and not flagged."""
    block = _strategy().result_blocks()["fednoro"]
    assert block["detected_after_round"] is None and block["vote_agreement"] is None
    assert block["detections"] == [] and block["class_loss_queries"] == 0
    assert block["clients"] == [{"client": pid, "loss_score": None, "detected_noisy": False} for pid in range(6)]


def test_the_warm_up_defaults_to_a_tenth_of_the_rounds_and_detection_follows_it(flower_identity):
    """With warmup null T1 = 30 // 10 = 3: the detection is due before the 4th round, not the 3rd."""
    strategy = _strategy(num_rounds=30, warmup=None)
    grid = _ClassLossGrid(_LOSSES)
    _round(strategy, grid, 3)
    assert grid.queries == [] and strategy.noisy is None
    _round(strategy, grid, 4)
    assert [pid for pid, _ in grid.queries] == list(range(6))


def test_detection_asks_every_client_with_the_round_then_flags_the_high_loss_ones(flower_identity, capsys):
    """After 2 warm-up rounds all six clients (not only the sampled half) are asked, with the round
    the detection precedes; clients 3 and 4 have the high losses. Scores are the row sums of the
    min-max normalised losses: class 0 spans 0.1..0.9, class 1 0.1..0.9 (client 5's missing class is
    the column minimum 0.1): client 0 (0 + 1/8), 1 (1/8 + 0), 3 (1 + 7/8), 4 (7/8 + 1), 5 (1/8 + 0).
    Truth {1, 3, 4}: precision 1, recall 2/3, F1 0.8, in the line a user reads."""
    strategy = _strategy(truth=_truth({1, 3, 4}))
    grid = _ClassLossGrid(_LOSSES)
    _round(strategy, grid, 3)
    assert [(pid, ins.server_round, ins.transform, ins.counts) for pid, ins in grid.queries] == [
        (pid, 3, "eval", False) for pid in range(6)]
    assert strategy.noisy == {3, 4} and strategy.stage == "distill"
    assert capsys.readouterr().out == (
        "[fednoro] detection after 2 warm-up rounds: 2 of 6 clients noisy (100% of 9 mixture fits agree); "
        "precision 1.000, recall 0.667, F1 0.800\n")
    block = strategy.result_blocks()["fednoro"]
    assert block["detected_after_round"] == 2 and block["vote_agreement"] == 1.0
    assert block["class_loss_queries"] == 6
    assert block["detections"] == [{"after_round": 2, "noisy_clients": 2, "vote_agreement": 1.0,
                                    "detection": pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8})}]
    scores = [1 / 8, 1 / 8, 0.0, 15 / 8, 15 / 8, 1 / 8]
    assert block["clients"] == [{"client": pid, "loss_score": pytest.approx(scores[pid]),
                                 "detected_noisy": pid in (3, 4), "true_noise": 0.5 * (pid in (1, 3, 4))}
                                for pid in range(6)]


def test_each_detection_votes_with_seeds_from_its_own_named_stream_and_logs_the_agreement(
        flower_identity, capsys, monkeypatch):
    """The first detection's GMM seeds come from the run seed's stream ``fednoro-detection``, a
    re-detection's from ``fednoro-detection/<round>`` (gmm_runs of them below 2**31), so a vote can
    be repeated. The line shows the agreement as a percentage (7 of 9 fits: 78%) and says which
    detection it is; without ground truth it has no precision."""
    import strategies.fednoro as fednoro
    from common.seeding import rng_for

    seen: list[list[int]] = []

    def vote(matrix, seeds):
        seen.append(list(seeds))
        return (3, 4), 7 / 9

    monkeypatch.setattr(fednoro, "voted_noisy_rows", vote)
    strategy = _strategy(redetect_every=2)
    grid = _ClassLossGrid(_LOSSES)
    for server_round in range(1, 8):
        _round(strategy, grid, server_round)
    assert sorted({ins.server_round for _, ins in grid.queries}) == [3, 5, 7]
    expected = [[int(s) for s in rng_for(1, stream).integers(2**31, size=9)]
                for stream in ("fednoro-detection", "fednoro-detection/4", "fednoro-detection/6")]
    assert seen == expected and all(0 <= s < 2**31 for s in sum(seen, []))
    assert capsys.readouterr().out.splitlines() == [
        "[fednoro] detection after 2 warm-up rounds: 2 of 6 clients noisy (78% of 9 mixture fits agree)",
        "[fednoro] detection after 4 rounds (re-detection): 2 of 6 clients noisy (78% of 9 mixture fits agree)",
        "[fednoro] detection after 6 rounds (re-detection): 2 of 6 clients noisy (78% of 9 mixture fits agree)"]
    assert strategy.result_blocks()["fednoro"]["detected_after_round"] == 2


def test_the_detection_line_is_flushed_at_once(flower_identity, monkeypatch):
    """The line is printed with flush=True: a run whose output goes to a file or pipe shows the
    detection when it happens, not when the buffer fills."""
    import strategies.fednoro as fednoro

    printed: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(fednoro, "print", lambda *args, **kwargs: printed.append((args, kwargs)), raising=False)
    _round(_strategy(), _ClassLossGrid(_LOSSES), 3)
    assert len(printed) == 1 and printed[0][1] == {"flush": True}
    assert printed[0][0][0].startswith("[fednoro] detection after 2 warm-up rounds: 2 of 6 clients noisy")


def test_redetection_is_due_every_r_rounds_after_the_first_and_not_again_in_its_round(flower_identity):
    """redetect_every=1: once S_n is found after round 2, detection is not due again at round 2, and is
    due at round 3 (one round after)."""
    strategy = _strategy(redetect_every=1)
    strategy.stage_rounds = 2
    assert strategy.detection_due()
    strategy.noisy = frozenset({3})
    assert not strategy.detection_due()
    strategy.stage_rounds = 3
    assert strategy.detection_due()


def test_only_noisy_clients_are_told_to_distil_with_the_ramped_weight(flower_identity):
    """After detection S_n = {1}: client 1 gets noisy=True and lambda_t at stage round 3 of the ramp
    b = 2, e = 10 // 2 - 1 = 4: 0.8 exp(-5 (1 - 1/2)^2); a clean client gets noisy=False and 0."""
    strategy = _strategy()
    strategy.noisy, strategy.stage_rounds = frozenset({1}), 3
    noisy, clean = strategy.plugin_ins(1), strategy.plugin_ins(0)
    assert noisy.noisy and noisy.kd_weight == pytest.approx(0.8 * math.exp(-1.25))
    assert (clean.noisy, clean.kd_weight) == (False, 0.0)
    assert (clean.temperature, clean.la_tau, clean.absent_classes) == (0.8, 1.0, "neg_inf")


def _replies(states: dict[int, dict[str, list[float]]]):
    from flwr.app import Array, ArrayRecord

    from protocol.messages import TrainStats
    from strategies.base import TrainReply

    return {pid: TrainReply(ArrayRecord({k: Array(np.array(v, np.float32)) for k, v in state.items()}),
                            TrainStats(num_examples=10, train_loss=1.0, steps=1)) for pid, state in states.items()}


# Client 0 is clean at 0; noisy client 1 is (3, 0), (4) off in the parameters w, b; noisy client 2 is
# 1 off in b and 10 in the float buffer bn.
_STATES = {0: {"w": [0.0, 0.0], "b": [0.0], "bn": [0.0]},
           1: {"w": [3.0, 0.0], "b": [4.0], "bn": [0.0]},
           2: {"w": [0.0, 0.0], "b": [1.0], "bn": [10.0]}}


@pytest.mark.parametrize(("distance", "buffers", "d1", "d2"), [
    ("per_tensor", False, 7.0, 1.0),              # 3 + 4; 1
    ("global_l2", False, 5.0, 1.0),               # sqrt(9 + 16); 1
    ("per_tensor", True, 7.0, 11.0),              # the buffer adds 10 to client 2
    ("global_l2", True, 5.0, math.sqrt(101.0)),
])
def test_daagg_weighs_noisy_participants_by_the_configured_distance(flower_identity, distance, buffers, d1, d2):
    """With S_n = {1, 2} and equal sizes the weights are (1, exp(-d1/m), exp(-d2/m)) / sum, m = max(d1,
    d2); the distance is the per-tensor sum or the global norm, over the parameters (w, b) or with
    the buffers too; the new global model is the weighted mean."""
    strategy = _strategy(parameter_names=("w", "b"), distance=distance, distance_buffers=buffers)
    strategy.noisy = frozenset({1, 2})
    new = strategy.aggregate(_replies(_STATES)).to_numpy_ndarrays()
    raw = np.array([1.0, math.exp(-d1 / max(d1, d2)), math.exp(-d2 / max(d1, d2))])
    w = raw / raw.sum()
    np.testing.assert_allclose(new[0], [3.0 * w[1], 0.0], rtol=1e-6)
    np.testing.assert_allclose(new[1], [4.0 * w[1] + w[2]], rtol=1e-6)
    np.testing.assert_allclose(new[2], [10.0 * w[2]], rtol=1e-6)


def test_a_round_with_one_participant_after_detection_is_its_model(flower_identity):
    """A lone participant (noisy or clean) is all clean or all noisy: FedAvg, its own model."""
    strategy = _strategy()
    strategy.noisy = frozenset({1})
    for pid in (0, 1):
        new = strategy.aggregate(_replies({pid: _STATES[1]})).to_numpy_ndarrays()
        np.testing.assert_allclose(new[0], [3.0, 0.0])


def test_a_bad_detection_reply_names_its_client_and_unequal_lengths_name_the_clients(flower_identity):
    """The run stops with a one-line reason: a client's reply without its mask names that client; replies
    of different widths name the clients' losses and the widths found."""
    from strategies.base import ClientFailure

    class _NoMask(_ClassLossGrid):
        def send_and_receive(self, messages, timeout=None):
            answers = super().send_and_receive(messages, timeout)
            for answer in answers:
                if answer.metadata.src_node_id == _NODES[2]:
                    del answer.content["metrics"]["present"]
            return answers

    with pytest.raises(ClientFailure, match=r"^client 2 sent a bad message: key 'present' is missing$"):
        _round(_strategy(), _NoMask(_LOSSES), 3)
    with pytest.raises(ProtocolError, match=r"^the clients sent a bad message: key 'losses' have different "
                                            r"lengths \[2, 3\]$"):
        _round(_strategy(), _ClassLossGrid({**_LOSSES, 4: (0.8, 0.9, 0.3)}), 3)


@pytest.mark.parametrize(("num_rounds", "warmup", "kd_ramp_end", "expected"), [
    (5, None, "half", (1, 1)),        # T1 at least 1; e = 5 // 2 - 1
    (10, None, "half", (1, 4)),
    (25, None, "half", (2, 11)),      # whole rounds: 25 // 10, 25 // 2 - 1
    (100, None, "half", (10, 49)),    # the released code's schedule
    (100, None, "end", (10, 100)),    # FNBench's
    (25, 7, "half", (7, 11)),
])
def test_the_warm_up_and_the_ramp_are_whole_rounds(num_rounds, warmup, kd_ramp_end, expected):
    """T1 = max(1, R // 10) unless set; lambda's ramp ends at R // 2 - 1 (``half``) or R (``end``)."""
    from defaults import strategy_settings

    settings = strategy_settings("fednoro", warmup=warmup, kd_ramp_end=kd_ramp_end)
    assert settings.ramp_of(num_rounds) == expected
    assert all(type(value) is int for value in settings.ramp_of(num_rounds))


def test_the_warm_up_is_checked_against_the_rounds_a_budget_pays_for():
    """10 clients, half sampled: a budget of 15 participations pays for 3 rounds (not num_rounds' 10),
    so a 3-round warm-up leaves none to detect in."""
    from defaults import context, strategy_settings

    settings = strategy_settings("fednoro", num_rounds=10, fraction=0.5, warmup=3)
    settings.check_options(context(num_clients=10))  # 10 rounds, ramp end 4: fine
    with pytest.raises(ConfigError, match=r"warmup=3 is invalid: allowed is fewer than the run's 3 rounds$"):
        settings.check_options(context(num_clients=10, comm_budget=15))


_TWO_TENSORS = [{"w": np.array([0.0, 0.0]), "b": np.array([0.0])}, {"w": np.array([3.0, 0.0]), "b": np.array([4.0])},
                {"w": np.array([0.0, 0.0]), "b": np.array([1.0])}]


def test_daagg_measures_per_tensor_by_default_and_scales_only_a_positive_largest_distance():
    """By default (the released code's) d sums per-tensor norms: d = (0, 7, 1) -> D = (0, 1, 1/7). Distances
    below 1 are still divided by the largest: b off by 0.5 and 0.25 -> D = (0, 1, 1/2). Noisy clients
    that sit on a clean one (largest distance 0) keep their plain size weights."""
    sizes, noisy, keys = [10.0, 10.0, 20.0], [False, True, True], ["w", "b"]
    raw = np.array([10.0, 10.0 * math.exp(-1.0), 20.0 * math.exp(-1 / 7)])
    np.testing.assert_allclose(daagg_weights(_TWO_TENSORS, sizes, noisy, keys), raw / raw.sum())
    near = [{"b": np.array([0.0])}, {"b": np.array([0.5])}, {"b": np.array([0.25])}]
    raw = np.array([10.0, 10.0 * math.exp(-1.0), 20.0 * math.exp(-0.5)])
    np.testing.assert_allclose(daagg_weights(near, sizes, noisy, ["b"]), raw / raw.sum())
    same = [{"b": np.array([0.5])}] * 3
    np.testing.assert_allclose(daagg_weights(same, sizes, noisy, ["b"]), [0.25, 0.25, 0.5])


def test_a_clean_client_weighs_by_its_size_even_when_its_model_diverged():
    """D is 0 for a clean client by definition, not its distance to the clean ones: a clean client
    whose weights are NaN (a diverged local run) leaves every weight a number. The noisy client's
    nearest clean model is client 0's, at distance 2: D = 1."""
    states = [{"w": np.array([0.0])}, {"w": np.array([math.nan])}, {"w": np.array([2.0])}]
    weights = daagg_weights(states, [10.0, 10.0, 10.0], [False, False, True], ["w"])
    raw = np.array([1.0, 1.0, math.exp(-1.0)])
    np.testing.assert_allclose(weights, raw / raw.sum())


@pytest.mark.parametrize("record, counts, message", [
    ({"losses": [1.0, 2.0], "present": [1, 0], "counts": [3, 0]}, True, "key 'present' was not asked for"),
    ({"losses": [1.0, math.nan], "present": [1, 1]}, False, "key 'losses' must be finite numbers"),
    ({"losses": [1.0, math.inf], "counts": [3, 1]}, True, "key 'losses' must be finite numbers"),
    ({"losses": [1.0, 2.0], "counts": [3, -1]}, True, "key 'counts' must be one count >= 0 per class loss"),
    ({"losses": [1.0, 2.0]}, False, "key 'present' is missing"),
    ({"present": [1, 1]}, False, "key 'losses' is missing"),
])
def test_a_bad_detection_reply_is_one_line_naming_its_client_and_key(record, counts, message):
    """Each refusal names the client that sent the reply and the key at fault (the whole message)."""
    from flwr.app import MetricRecord, RecordDict

    from strategies.fednoro import read_class_losses

    with pytest.raises(ProtocolError, match=f"^client 4 sent a bad message: {message}$"):
        read_class_losses(RecordDict({"metrics": MetricRecord(record)}), "client 4", counts)


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps, reason="long double is float64 here")
def test_state_distance_is_float64_arithmetic_whatever_float_type_a_client_sends():
    """Both states are rounded to float64 before the difference: arrays that differ only below float64's
    resolution (in long double, on either side) are at distance 0, as their float64 copies are, so
    DaAgg's weights do not depend on the float type a client's reply happens to use."""
    tiny = np.longdouble(1) + np.longdouble(2) ** -60
    a = {"x": np.array([tiny], np.longdouble), "y": np.array([1.0], np.longdouble)}
    b = {"x": np.array([1.0], np.longdouble), "y": np.array([tiny], np.longdouble)}
    assert a["x"][0] != b["x"][0], "long double holds the difference"
    assert state_distance(a, b, ["x", "y"], per_tensor=True) == 0.0
    assert state_distance(a, b, ["x", "y"], per_tensor=False) == 0.0
