"""Local learners: each loss on small hand-computed inputs, the server's schedules, the second view,
Co-teaching's pair, and every learner end to end on the smoke preset, standalone and as FedCorr's stage 3."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from defaults import coteaching_settings, local_training, lsr_settings, sce_settings
from torch import nn

from common.errors import ConfigError
from data.second_view import _shift_hue, colour_distort, rotate, second_view
from models.peer_pair import PeerPair, is_pair_state
from protocol.messages import CONFIG, TRAIN
from server.config import load_run
from settings.compose import compose_config
from task.evaluation import evaluate, evaluate_by_class
from task.learner_settings import LearnerSchedule
from task.learners import Batch, make_learner
from task.learners.ce import CrossEntropy
from task.learners.coteaching import Coteaching, kept_count, small_loss_rows
from task.learners.lsr import LocalSelfRegularisation, classification_loss, distillation, lsr_loss, sharpen, tempered
from task.learners.mixup import Mix, Mixup, beta_stream
from task.learners.sce import SymmetricCrossEntropy, reverse_cross_entropy, symmetric_cross_entropy

SMOKE = "experiment=smoke"


# --- LSR -------------------------------------------------------------------------------------------

def test_sharpening_squares_and_renormalises_at_t_one_half():
    p = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    expected = torch.tensor([[0.36 / 0.52, 0.16 / 0.52], [0.5, 0.5]])
    assert torch.allclose(sharpen(p, 0.5), expected)
    assert torch.allclose(sharpen(p, 1.0), p)


def test_classification_loss_text_and_code_readings():
    p_s = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    labels = torch.tensor([0, 0])
    # Text: -log p_s[y], averaged.
    assert classification_loss(p_s, labels, "nll").item() == pytest.approx(-(math.log(0.8) + math.log(0.3)) / 2)
    # Code: cross-entropy with p_s as logits: -log(e^{p_y} / sum e^{p_j}); bounded by log(1 + e).
    code = [-math.log(math.exp(0.8) / (math.exp(0.8) + math.exp(0.2))),
            -math.log(math.exp(0.3) / (math.exp(0.3) + math.exp(0.7)))]
    assert classification_loss(p_s, labels, "logits_ce").item() == pytest.approx(sum(code) / 2)


def test_tempered_predictions_at_t_d_one_third_and_their_floor():
    logits = torch.tensor([[0.0, math.log(2.0)], [0.0, 100.0]])
    q = tempered(logits, 1 / 3)
    # softmax([0, 3 ln 2]) = [1/9, 8/9]; the second row's tiny entry is clamped to 1e-6.
    assert torch.allclose(q[0], torch.tensor([1 / 9, 8 / 9]))
    assert q[1, 0].item() == pytest.approx(1e-6)
    # The clamp's upper bound 1 counts too: softmax((0, -20)) is (1 - 2e-9, 2e-9), exactly (1, 2e-9) in
    # float32; both entries are clamped (1 at the top, 2e-9 up to 1e-6) and a clamped entry passes no
    # gradient, so neither logit gets any (without the bound the second would get -2e-9 via the first).
    saturated = torch.tensor([[0.0, -20.0]], requires_grad=True)
    tempered(saturated, 1.0)[0, 0].backward()
    assert torch.equal(saturated.grad, torch.zeros(1, 2))


def test_js_and_l1_distillation_by_hand():
    q1 = torch.tensor([[0.5, 0.5]])
    q2 = torch.tensor([[0.9, 0.1]])
    # U = [0.7, 0.3]; KL(q1 || U) and KL(q2 || U) worked out term by term.
    kl1 = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    kl2 = 0.9 * math.log(0.9 / 0.7) + 0.1 * math.log(0.1 / 0.3)
    assert distillation(q1, q2, "js", "sum").item() == pytest.approx((kl1 + kl2) / 2, rel=1e-5)
    assert distillation(q1, q2, "js", "elementwise_mean").item() == pytest.approx((kl1 + kl2) / 4, rel=1e-5)
    assert distillation(q1, q2, "l1", "sum").item() == pytest.approx(0.8)
    assert distillation(q1, q1, "js", "sum").item() == pytest.approx(0.0, abs=1e-7)


def test_lsr_defaults_are_cross_entropy_on_p_s_as_logits_and_the_elementwise_mean():
    # FedLSR: "we use p_s instead of logits in Eq. 1", Eq. 1 being cross-entropy on logits; Table 2's
    # gamma values weigh the released code's divergence averaged over batch x classes.
    options = lsr_settings()
    assert (options.cls_loss, options.reduction) == ("logits_ce", "elementwise_mean")
    o1 = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    o2 = torch.tensor([[0.0, 1.0, 0.0], [1.0, -2.0, 0.0]])
    labels = torch.tensor([1, 2])
    lam = 0.25
    p_s = sharpen(lam * torch.softmax(o1, 1) + (1 - lam) * torch.softmax(o2, 1), 0.5)
    cls = sum(-math.log(math.exp(row[y]) / sum(math.exp(v) for v in row))
              for row, y in zip(p_s.tolist(), labels.tolist())) / 2
    q1, q2 = tempered(o1, 1 / 3), tempered(o2, 1 / 3)
    middle = (q1 + q2) / 2
    # Each KL summed over all 2 x 3 entries, then divided by their count: the elementwise mean.
    kl = [float((q * (q.log() - middle.log())).sum()) / 6 for q in (q1, q2)]
    loss = lsr_loss(o1, o2, labels, lam, 0.4, options)
    assert loss.reported.item() == pytest.approx(cls, rel=1e-5)
    assert loss.objective.item() == pytest.approx(cls + 0.4 * (kl[0] + kl[1]) / 2, rel=1e-5)
    # The switches: the text's other reading of the loss, and the per-sample sum (3 classes: 3x the weight).
    nll = lsr_loss(o1, o2, labels, lam, 0.0, lsr_settings(cls_loss="nll"))
    assert nll.reported.item() == pytest.approx(float(-p_s[[0, 1], [1, 2]].log().mean()), rel=1e-5)
    summed = lsr_loss(o1, o2, labels, lam, 0.4, lsr_settings(reduction="sum"))
    assert summed.objective.item() - cls == pytest.approx(3 * 0.4 * (kl[0] + kl[1]) / 2, rel=1e-5)


def test_lsr_objective_adds_the_weighted_distillation_and_reports_the_classification_loss():
    o1 = torch.tensor([[2.0, 0.0, -1.0]])
    o2 = torch.tensor([[0.0, 1.0, 0.0]])
    labels = torch.tensor([1])
    options = lsr_settings(cls_loss="nll", reduction="sum")
    lam = 0.25
    mixed = lam * torch.softmax(o1, 1) + (1 - lam) * torch.softmax(o2, 1)
    cls = -math.log(sharpen(mixed, 0.5)[0, 1].item())
    reg = distillation(tempered(o1, 1 / 3), tempered(o2, 1 / 3), "js", "sum").item()
    loss = lsr_loss(o1, o2, labels, lam, 0.6, options)
    assert loss.reported.item() == pytest.approx(cls, rel=1e-5)
    assert loss.objective.item() == pytest.approx(cls + 0.6 * reg, rel=1e-5)
    assert lsr_loss(o1, o2, labels, lam, 0.0, options).objective.item() == pytest.approx(cls, rel=1e-5)
    # LSR+: the mean entropy of the two views' predictions, weighted by lambda_e.
    entropy = sum(-(p * p.log()).sum().item() for p in (torch.softmax(o1, 1), torch.softmax(o2, 1))) / 2
    plus = lsr_loss(o1, o2, labels, lam, 0.0, lsr_settings(cls_loss="nll", entropy_weight=0.5))
    assert plus.objective.item() == pytest.approx(cls + 0.5 * entropy, rel=1e-5)


def test_the_nll_reading_takes_the_log_of_tiny_probabilities_in_their_own_precision():
    # In double precision a probability of 1e-100 is representable: its -log is 100 ln 10, not
    # the -log of single precision's smallest normal (87.3).
    p_s = torch.tensor([[1.0, 1e-100]], dtype=torch.float64)
    loss = classification_loss(p_s, torch.tensor([1]), "nll")
    assert loss.item() == pytest.approx(100 * math.log(10.0), rel=1e-12)


def test_l1_distillation_under_the_elementwise_mean_and_the_l1_and_no_distillation_objectives():
    q1 = torch.tensor([[0.5, 0.5]])
    q2 = torch.tensor([[0.9, 0.1]])
    # |0.5 - 0.9| + |0.5 - 0.1| = 0.8 over one row of two classes: 0.4 per entry.
    assert distillation(q1, q2, "l1", "elementwise_mean").item() == pytest.approx(0.4)
    o1 = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    o2 = torch.tensor([[0.0, 1.0, 0.0], [1.0, -2.0, 0.0]])
    labels = torch.tensor([1, 2])
    cls = lsr_loss(o1, o2, labels, 0.25, 0.0, lsr_settings()).objective.item()
    # The non-IID choice: gamma times the mean |q1 - q2| over the 2 x 3 entries of the tempered predictions.
    t1, t2 = (torch.softmax(o / (1 / 3), 1) for o in (o1, o2))
    l1 = float((t1 - t2).abs().sum()) / 6
    assert lsr_loss(o1, o2, labels, 0.25, 0.6, lsr_settings(distill="l1")).objective.item() == pytest.approx(
        cls + 0.6 * l1, rel=1e-5)
    # Table 5's "no distillation": the objective is the classification loss whatever the weight.
    assert lsr_loss(o1, o2, labels, 0.25, 0.6, lsr_settings(distill="none")).objective.item() == pytest.approx(
        cls, rel=1e-6)


def test_lsr_plus_entropy_is_the_mean_over_rows_in_either_form():
    o1 = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])  # softmax rows (0.75, 0.25) and (0.5, 0.5)
    o2 = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    labels = torch.tensor([0, 1])
    cls = lsr_loss(o1, o2, labels, 0.5, 0.0, lsr_settings()).objective.item()

    def h(row: list[float]) -> float:
        return -sum(p * math.log(p) for p in row)

    # outputs: the two views' mean entropies averaged; each view's entropy is the mean over its rows.
    view1 = (h([0.75, 0.25]) + h([0.5, 0.5])) / 2
    view2 = h([0.5, 0.5])
    plus = lsr_loss(o1, o2, labels, 0.5, 0.0, lsr_settings(entropy_weight=0.5, entropy_form="outputs"))
    assert plus.objective.item() == pytest.approx(cls + 0.5 * (view1 + view2) / 2, rel=1e-6)
    # tempered (the released code): entropy of softmax(q1), q1 = softmax(o1 / T_d) with T_d = 1/3:
    # row 1 gives q1 = (27/28, 1/28), row 2 (1/2, 1/2), whose softmax is again (1/2, 1/2).
    a = 1.0 / (1.0 + math.exp(1 / 28 - 27 / 28))
    tempered_h = (h([a, 1 - a]) + h([0.5, 0.5])) / 2
    code = lsr_loss(o1, o2, labels, 0.5, 0.0, lsr_settings(entropy_weight=0.5, entropy_form="tempered"))
    assert code.objective.item() == pytest.approx(cls + 0.5 * tempered_h, rel=1e-6)
    assert code.reported.item() == pytest.approx(cls, rel=1e-6)


def test_a_zero_weight_leaves_out_the_term_it_would_scale():
    # gamma_t = 0 (the warm-up's first round) and lambda_e = 0 switch their terms off: neither term is
    # computed, so one that cannot be (T_d = 1e-39 overflows o / T_d in float32: the tempered views
    # are nan) does not turn the objective into cls + 0 * nan = nan.
    o1 = torch.tensor([[1.0, 0.0]])
    o2 = torch.tensor([[0.0, 1.0]])
    settings = lsr_settings(distill_temperature=1e-39, entropy_form="tempered")
    # lambda = 1/2 mixes the views' softmaxes (a, 1 - a) and (1 - a, a) into (1/2, 1/2), which any
    # sharpening keeps; cross-entropy with it as logits is log 2.
    loss = lsr_loss(o1, o2, torch.tensor([0]), 0.5, 0.0, settings)
    assert loss.objective.item() == pytest.approx(math.log(2.0))


@pytest.mark.parametrize("augment_draw", ["sample", "batch"])
def test_the_lsr_learner_feeds_both_views_with_one_beta_one_one_lambda(augment_draw: str):
    # Alg. 1: the batch and its second view (drawn per image or once per batch) through the same
    # network, mixed with lambda ~ Beta(1, 1) drawn from the learner's stream, weighted by gamma_t.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    images = torch.randint(0, 256, (4, 1, 4, 4), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    settings = lsr_settings(augment_draw=augment_draw)

    def as_float(x, g):
        return x.float() / 32

    learner = LocalSelfRegularisation(settings, 0.4, torch.Generator().manual_seed(5))
    batch = Batch(images, labels, as_float, torch.Generator().manual_seed(9))  # type: ignore[arg-type]
    loss = learner(model, batch)
    # The same draws by hand: lambda from a NumPy stream seeded once from the learner's generator, the
    # second view from the batch's generator.
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=torch.Generator().manual_seed(5)))
    lam = float(np.random.default_rng(seed).beta(1.0, 1.0))
    view = second_view(images, torch.Generator().manual_seed(9), augment_draw == "sample")
    expected = lsr_loss(model(as_float(images, None)), model(as_float(view, None)), labels, lam, 0.4, settings)
    torch.testing.assert_close(loss.objective, expected.objective)
    torch.testing.assert_close(loss.reported, expected.reported)


def test_gamma_rises_linearly_over_the_warm_up_then_stays():
    options = lsr_settings(gamma=0.6, warmup_rounds=20)
    assert [options.weight_at(t) for t in (0, 10, 19, 20, 50)] == pytest.approx([0.0, 0.3, 0.57, 0.6, 0.6])
    assert lsr_settings(gamma=0.6, warmup_rounds=0).weight_at(0) == 0.6


# --- SCE and Co-teaching ---------------------------------------------------------------------------

def test_reverse_cross_entropy_clamps_log_zero_at_the_label_floor():
    logits = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)]])
    labels = torch.tensor([0])
    # RCE = -sum_c p_c log q_c = -log(1e-4) * (1 - p_y).
    assert reverse_cross_entropy(logits, labels, 1e-4).item() == pytest.approx(-math.log(1e-4) * 0.3, rel=1e-5)
    options = sce_settings(alpha=0.1, beta=1.0)
    expected = 0.1 * -math.log(0.7) + 1.0 * -math.log(1e-4) * 0.3
    assert symmetric_cross_entropy(logits, labels, options).item() == pytest.approx(expected, rel=1e-5)
    # In double precision, to double precision: log(1e-4) taken in single precision is off by ~1e-8.
    in_double = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)]], dtype=torch.float64)
    exact = reverse_cross_entropy(in_double, labels, 1e-4).item()
    assert exact == pytest.approx(-math.log(1e-4) * 0.3, rel=1e-12)


def test_reverse_cross_entropy_keeps_each_prediction_at_least_1e_7():
    # Per sample: a prediction all on the label (the others underflow to 0 in float32) counts each
    # other class as 1e-7, so its RCE is -log(1e-4) * 2e-7, not 0; the first row is as above.
    logits = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)], [0.0, -200.0, -200.0]])
    per_sample = reverse_cross_entropy(logits, torch.tensor([0, 0]), 1e-4)
    assert per_sample.tolist() == pytest.approx([-math.log(1e-4) * 0.3, -math.log(1e-4) * 2e-7], rel=1e-5)
    # ... and at most 1 (the clamp to [1e-7, 1]): a confidently wrong prediction, exactly (1, 2e-9, 2e-9)
    # in float32 with label 1, is clamped in every entry, and a clamped entry passes no gradient.
    saturated = torch.tensor([[0.0, -20.0, -20.0]], requires_grad=True)
    reverse_cross_entropy(saturated, torch.tensor([1]), 1e-4).sum().backward()
    assert torch.equal(saturated.grad, torch.zeros(1, 3))


def test_coteaching_keeps_the_small_loss_share_and_ramps_its_forget_rate():
    assert [kept_count(10, rate) for rate in (0.0, 0.25, 0.5, 0.99)] == [10, 7, 5, 1]
    # Products a float hair under an integer: (1 - 0.8) * 10, (1 - 0.55) * 60, (1 - 0.56) * 25; and one
    # exactly a hair under, which stays under: (1 - 3e-11) * 10 = 9.9999999997.
    assert [kept_count(10, 0.8), kept_count(60, 0.55), kept_count(25, 0.56), kept_count(10, 3e-11)] == [2, 27, 11, 9]
    options = coteaching_settings(forget_rate=0.4, ramp_rounds=10)
    assert [options.forget_at(t) for t in (0, 5, 10, 30)] == pytest.approx([0.0, 0.2, 0.4, 0.4])


class _Fixed(nn.Module):
    """A network whose logits are a fixed table per input row index (the input is the index)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x.long().view(-1)]


def test_each_coteaching_network_learns_from_the_rows_its_peer_kept():
    labels = torch.tensor([0, 0, 0, 0])
    # First network finds rows 0, 1 easy; second finds rows 2, 3 easy.
    first = _Fixed(torch.tensor([[5.0, 0.0], [4.0, 0.0], [0.0, 1.0], [0.0, 2.0]]))
    second = _Fixed(torch.tensor([[0.0, 2.0], [0.0, 1.0], [4.0, 0.0], [5.0, 0.0]]))
    pair = PeerPair(first, second)
    batch = Batch(torch.arange(4).view(4, 1, 1, 1), labels, lambda x, g: x, torch.Generator())  # type: ignore[arg-type]
    loss = Coteaching(forget_rate=0.5)(pair, batch)
    loss.objective.backward()
    # First trains on rows 2, 3 (second's picks), second on rows 0, 1 (first's picks).
    assert first.table.grad is not None and second.table.grad is not None
    assert torch.count_nonzero(first.table.grad[:2]) == 0 and torch.count_nonzero(first.table.grad[2:]) == 4
    assert torch.count_nonzero(second.table.grad[2:]) == 0 and torch.count_nonzero(second.table.grad[:2]) == 4
    ce = torch.nn.functional.cross_entropy
    expected = ce(first.table[2:], labels[2:]) + ce(second.table[:2], labels[:2])
    assert loss.objective.item() == pytest.approx(expected.item())
    # It reports the mean of the two networks' losses. Each is log(1 + e) and log(1 + e^2) on its two
    # rows (logits (0, 1) and (0, 2) against label 0), averaged: their mean is that average too.
    assert loss.reported.item() == pytest.approx((math.log(1 + math.e) + math.log(1 + math.e**2)) / 2)


def test_coteaching_needs_a_pair_and_breaks_ties_in_the_losses_by_row_order():
    batch = Batch(torch.zeros(2, 1, 1, 1), torch.tensor([0, 1]), lambda x, g: x, torch.Generator())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^learner=coteaching needs a PeerPair of two networks, not a Linear$"):
        Coteaching(forget_rate=0.5)(nn.Linear(1, 2), batch)
    # Equal losses (identical predictions, as from a constant start): the first rows are kept.
    assert torch.equal(small_loss_rows(torch.zeros(1000), 300), torch.arange(300))


def test_a_pair_scores_as_the_mean_of_its_networks(digits):
    from data.transforms import TransformPair, TransformSpec

    _, eval_tf = TransformPair(TransformSpec(), TransformSpec()).build(digits.mean, digits.std)
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Flatten(), nn.Linear(64, 10)) for _ in range(2)]
    images, labels = digits.test.images[:200], digits.test.labels[:200]
    each = [evaluate(net, images, labels, eval_tf) for net in nets]
    both = evaluate(PeerPair(*nets), images, labels, eval_tf)
    assert both.accuracy == pytest.approx((each[0].accuracy + each[1].accuracy) / 2)
    assert both.loss == pytest.approx((each[0].loss + each[1].loss) / 2)
    assert evaluate_by_class(PeerPair(*nets), images, labels, eval_tf) == (both, None)  # no single prediction
    assert is_pair_state(PeerPair(*nets).state_dict()) and not is_pair_state(nets[0].state_dict())


# --- Mixup's draws ---------------------------------------------------------------------------------

def test_the_beta_stream_is_seeded_with_one_draw_in_zero_to_two_to_the_63_minus_one():
    # The seed is the generator's randint in [0, 2^63 - 1): a NumPy seed of 63 bits. Sixteen
    # generator seeds, so that a different range (which moves about half of the draws) shows.
    for seed in range(16):
        drawn = int(torch.randint(0, 2**63 - 1, (1,), generator=torch.Generator().manual_seed(seed)))
        assert beta_stream(torch.Generator().manual_seed(seed)).bit_generator.seed_seq.entropy == drawn


def test_mixup_draws_on_the_generators_device_whatever_the_default_device():
    # A default device (meta here, whose tensors hold no values; CUDA in practice) must not move the
    # draws off the generator's device: the Beta stream's seed and the partner permutation are the
    # generator's draws, and the permutation is then moved to the device asked for.
    generator = torch.Generator().manual_seed(4)
    with torch.device("meta"):
        mixup = Mixup(0.5, generator)
        mix = mixup.draw(6, torch.device("cpu"))
        elsewhere = mixup.draw(6, torch.device("meta"))
    replay = torch.Generator().manual_seed(4)
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=replay))
    assert mix.lam == float(np.random.default_rng(seed).beta(0.5, 0.5))
    assert torch.equal(mix.partner, torch.randperm(6, generator=replay))
    assert elsewhere.partner.device == torch.device("meta")


def test_mixup_asks_for_the_partners_on_the_batchs_device():
    # The permutation is drawn on the generator's device and must index the batch on the batch's
    # device (one left on a CUDA generator's device cannot index a CPU batch).
    asked: list[torch.device] = []

    class Recording(Mixup):
        def draw(self, batch: int, device: torch.device) -> Mix:
            asked.append(device)
            return super().draw(batch, device)

    batch = Batch(torch.arange(4).view(4, 1, 1, 1), torch.zeros(4, dtype=torch.long), lambda x, g: x.float(),
                  torch.Generator())  # type: ignore[arg-type]
    Recording(1.0, torch.Generator().manual_seed(0))(nn.Flatten(), batch)  # one logit per sample
    assert asked == [torch.device("cpu")]


# --- the second view -------------------------------------------------------------------------------

def test_rotation_is_drawn_per_image_or_per_batch_from_the_generator():
    image = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    image[0, 0, 4:24, 12:16] = 255  # a vertical bar
    batch = image.repeat(6, 1, 1, 1)
    per_image = rotate(batch, torch.Generator().manual_seed(1))
    per_batch = rotate(batch, torch.Generator().manual_seed(1), per_sample=False)
    assert per_image.dtype == torch.uint8 and per_image.shape == batch.shape
    assert len({bytes(view.numpy()) for view in per_image}) > 1
    assert len({bytes(view.numpy()) for view in per_batch}) == 1
    assert torch.equal(per_image, rotate(batch, torch.Generator().manual_seed(1)))
    # A rotation within 30 degrees moves the bar but keeps most of its mass.
    assert 0.6 < per_image.float().sum().item() / batch.float().sum().item() < 1.2


def test_colour_distortion_keeps_shape_and_a_zero_hue_shift_is_the_identity():
    rgb = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(_shift_hue(rgb, torch.zeros(4)), rgb, atol=1e-5)
    # A half-turn of hue on pure red gives cyan.
    red = torch.zeros(1, 3, 1, 1)
    red[0, 0] = 1.0
    assert torch.allclose(_shift_hue(red, torch.tensor([0.5])).view(3), torch.tensor([0.0, 1.0, 1.0]), atol=1e-5)
    images = (rgb * 255).to(torch.uint8)
    view = colour_distort(images, torch.Generator().manual_seed(2))
    assert view.shape == images.shape and view.dtype == torch.uint8 and not torch.equal(view, images)
    assert torch.equal(second_view(images, torch.Generator().manual_seed(2)), view)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        second_view(torch.zeros(1, 2, 4, 4, dtype=torch.uint8), torch.Generator())


# --- the learner by name --------------------------------------------------------------------------

def test_each_learner_is_built_by_name_with_its_settings_and_this_rounds_schedule():
    # The name picks the objective (a wrong one trains too, so the end-to-end runs cannot tell);
    # Co-teaching and LSR take this round's forget rate and gamma_t from the server's schedule.
    schedule = LearnerSchedule(distill_weight=0.3, forget_rate=0.2)
    generator = torch.Generator().manual_seed(0)
    mixup = make_learner(local_training(learner="mixup", mixup_alpha=0.5), schedule, generator)
    assert isinstance(mixup, Mixup) and mixup.alpha == 0.5 and mixup.generator is generator
    sce = make_learner(local_training(learner="sce", sce=sce_settings(beta=0.5)), schedule, generator)
    assert isinstance(sce, SymmetricCrossEntropy) and sce.settings == sce_settings(beta=0.5)
    pair = local_training(learner="coteaching", coteaching=coteaching_settings(forget_rate=0.4))
    coteaching = make_learner(pair, schedule, generator)
    assert isinstance(coteaching, Coteaching) and coteaching.forget_rate == 0.2
    lsr = make_learner(local_training(learner="lsr", lsr=lsr_settings(gamma=0.6)), schedule, generator)
    assert isinstance(lsr, LocalSelfRegularisation) and lsr.settings == lsr_settings(gamma=0.6)
    assert lsr.weight == 0.3
    assert isinstance(make_learner(local_training(), schedule, generator), CrossEntropy)


# --- settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    (["strategy=fedavg", "strategy.train.learner=coteaching"],
     r"strategy.train.coteaching.forget_rate=None is invalid: a number in \[0, 1\)"),
    (["strategy=fedavg", "strategy.train.learner=dividemix"], r"strategy.train.learner='dividemix' is invalid"),
    (["strategy=fedavg", "strategy.train.lsr.distill=kl"],
     r"strategy.train.lsr.distill='kl' is invalid: allowed are js, l1, none"),
    (["strategy=fedavg", "strategy.train.learner=mixup", "strategy.train.mixup_alpha=0"],
     r"strategy.train.mixup_alpha=0 is invalid: a number > 0 with learner=mixup"),
    (["strategy=feddyn", "strategy.train.learner=coteaching", "strategy.train.coteaching.forget_rate=0.2"],
     r"strategy.train.learner=coteaching is invalid: feddyn works with one network"),
    (["strategy=fedcorr", "strategy.train.learner=coteaching", "strategy.train.coteaching.forget_rate=0.2"],
     r"strategy.train.learner='coteaching' is invalid: a learner of one network: FedCorr's stages 1-2 train and "
     r"query one network \(set stage3_learner=coteaching for stage 3\)$"),
    (["strategy=fedcorr", "strategy.stage3_learner=coteaching"],
     r"strategy.train.coteaching.forget_rate=None is invalid: a number in \[0, 1\)"),
    (["strategy=fedcorr", "strategy.stage3=fedlsr", "strategy.stage3_learner=sce"],
     r"strategy.stage3_learner=sce is invalid: fedlsr trains with learner lsr"),
    (["strategy=fedcorr", "strategy.stage3=fedlsr", "strategy.train.learner=sce"],
     r"strategy.train.learner=sce is invalid: fedlsr trains with learner lsr"),
    (["strategy=fedcorr", "strategy.stage3=feddyn", "strategy.stage3_learner=coteaching",
      "strategy.train.coteaching.forget_rate=0.2"], r"strategy.stage3_learner=coteaching is invalid: feddyn works"),
])
def test_bad_learner_settings_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run(compose_config(overrides))


def test_the_fedlsr_preset_is_the_papers_protocol():
    plan = load_run(compose_config(["experiment=fedlsr_fmnist", "strategy=fedlsr"]))
    rounds = plan.strategy.settings
    assert (plan.settings.num_clients, plan.settings.model.name) == (100, "cnn9")
    assert (rounds.num_rounds, rounds.fraction) == (100, 0.05)
    assert rounds.train == local_training(lr=0.15, momentum=0.9, weight_decay=1e-4, epochs=5, batch_size=60,
                                         learner="lsr", lsr=rounds.train.lsr)
    assert (rounds.train.lsr.warmup_rounds, rounds.train.lsr.distill) == (20, "js")


# --- end to end on the smoke preset ----------------------------------------------------------------

def _schedules(grid) -> list[tuple[str, float, float]]:
    return [(m.content[CONFIG]["learner"], m.content[CONFIG]["schedule.distill-weight"],
             m.content[CONFIG]["schedule.forget-rate"])
            for m in grid.delivered if m.metadata.message_type == TRAIN]


@pytest.mark.parametrize("learner", ["ce", "mixup", "sce", "lsr", "coteaching"])
def test_every_learner_trains_standalone(run_inprocess, learner):
    options = ("strategy.train.lsr.warmup_rounds=2 strategy.train.lsr.gamma=0.5 "
               "strategy.train.coteaching.forget_rate=0.4 strategy.train.coteaching.ramp_rounds=2")
    # LSR's bounded loss (cross-entropy on p_s as logits) has small gradients: FedLSR pairs it with a
    # large learning rate (0.15), and three smoke rounds need one too.
    lr = "strategy.train.lr=0.2" if learner == "lsr" else ""
    payload, grid = run_inprocess(f"{SMOKE} strategy=fedavg strategy.num_rounds=3 "
                                  f"strategy.train.learner={learner} {options} {lr}")
    assert payload["summary"]["final_acc"] > 0.5, "a 10-class task learned well beyond chance"
    per_round = sorted({(row[1], row[2]) for row in _schedules(grid)})
    assert {row[0] for row in _schedules(grid)} == {learner}
    if learner == "lsr":
        assert per_round == [(0.0, 0.0), (0.25, 0.0), (0.5, 0.0)], "gamma_t sent by the server each round"
    elif learner == "coteaching":
        assert per_round == [(0.0, 0.0), (0.0, 0.2), (0.0, 0.4)], "R(T) sent by the server each round"
    else:
        assert per_round == [(0.0, 0.0)]


def test_coteaching_aggregates_each_network_with_its_twin(run_inprocess):
    _, grid = run_inprocess(f"{SMOKE} strategy=fedavg strategy.num_rounds=2 strategy.train.learner=coteaching "
                                  "strategy.train.coteaching.forget_rate=0.3")
    sent = [m.content["arrays"] for m in grid.delivered if m.metadata.message_type == TRAIN]
    assert all(is_pair_state(arrays.keys()) for arrays in sent)
    first_round = sent[0].to_torch_state_dict()
    # The two networks start from different seeded initialisations.
    weights = [key for key in first_round if key.startswith("first.") and key.endswith("weight")][0]
    assert not torch.equal(first_round[weights], first_round[weights.replace("first.", "second.", 1)])


def test_lsr_and_each_learner_run_as_fedcorr_stage_3(run_inprocess):
    # The train block's options for every stage-3 learner here, so that the later runs may take stages
    # 1-2 over from the first (they apply only to their own learner).
    small = (f"{SMOKE} strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=2 strategy.train.lsr.warmup_rounds=1 "
             "strategy.train.coteaching.forget_rate=0.2")
    payload, grid = run_inprocess(f"{small} strategy.stage3=fedlsr")
    stages = [row["stage"] for row in payload["rounds"]]
    learners = [row[0] for row in _schedules(grid)]
    assert stages[-2:] == ["usual", "usual"] and learners[-6:] == ["lsr"] * 6
    assert learners[:10] == ["mixup"] * 10, "stage 1 keeps FedCorr's mixup"
    assert learners[10:13] == ["ce"] * 3, "stage 2 keeps the train block's learner"
    # Stage 3's warm-up counts its own rounds: gamma_0 = 0, then gamma.
    assert [row[1] for row in _schedules(grid)][-6:] == [0.0] * 3 + [0.4] * 3
    first = payload["config"]["out_dir"]
    for learner in ("sce", "coteaching"):  # stages 1-2 as the first run's: only stage 3 differs
        payload, grid = run_inprocess(f"{small} strategy.stage3_learner={learner} strategy.stages12_from={first}")
        assert [row[0] for row in _schedules(grid)][-6:] == [learner] * 6
        assert payload["summary"]["final_acc"] > 0.5
