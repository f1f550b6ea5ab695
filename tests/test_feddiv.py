"""FedDiv: its maths on hand-computed inputs (the filter's posterior, EM and aggregation, the
consistency sampler, the local prior, the uniform-prior regulariser, the filter's two losses, the
sample selection with and without the released code's rules), the server's filter scope and warm-up
schedules, the client's state across recreated client processes, its settings, and whole in-process
runs with the paper's defaults and with the released code's switches."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord
from torch import nn

from client.plugins.feddiv import balanced, diagnostics, filter_losses, noise_share, select
from common.errors import ConfigError
from protocol.codec import decode, encode
from protocol.feddiv import FedDivClientSettings, FedDivIns, FedDivRes
from protocol.messages import TrainStats
from strategies.base import TrainReply
from strategies.feddiv import MAIN, FedDiv
from strategies.federation import Federation
from task.consistency import consistent, debiased_labels, updated_prior
from task.learners.base import Batch
from task.learners.mixup import Mixup
from task.learners.uniform_prior import MixupUniformPrior, uniform_prior_penalty
from task.noise_filter import NoiseFilter, aggregate_filters, clean_posterior, fit_filter, min_max, random_filter


def client_settings(**changes) -> FedDivClientSettings:
    return replace(strategy_settings("feddiv").params, **changes)


def test_min_max_scales_to_unit_range():
    np.testing.assert_allclose(min_max(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(min_max(np.array([3.0, 3.0])), [0.0, 0.0])


def test_the_clean_posterior_is_bayes_rule_on_the_two_gaussians():
    f = NoiseFilter(0.2, 0.8, 0.01, 0.04, 0.7, 0.3)
    x = np.array([0.1, 0.5, 0.9])

    def density(v, m, var):
        return math.exp(-(v - m) ** 2 / (2 * var)) / math.sqrt(2 * math.pi * var)

    expected = [0.7 * density(v, 0.2, 0.01) / (0.7 * density(v, 0.2, 0.01) + 0.3 * density(v, 0.8, 0.04))
                for v in x]
    np.testing.assert_allclose(clean_posterior(x, f), expected, rtol=1e-10)


def test_em_finds_two_separated_groups_and_orders_clean_first():
    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(0.1, 0.03, 300), rng.normal(0.85, 0.05, 100)])
    fitted = fit_filter(losses, seed=0)
    assert fitted.mean_clean == pytest.approx(0.1, abs=0.02) and fitted.mean_noisy == pytest.approx(0.85, abs=0.02)
    assert fitted.weight_clean == pytest.approx(0.75, abs=0.02)
    # From a global filter with the components the other way round, EM still ends clean-first.
    start = NoiseFilter(0.5, 0.2, 0.05, 0.05, 0.5, 0.5)
    warm = fit_filter(losses, seed=0, start=start)
    assert warm.mean_clean < warm.mean_noisy
    # Three EM steps from a poor start stay short of the converged fit.
    few = fit_filter(losses, seed=0, start=NoiseFilter(0.45, 0.55, 0.1, 0.1, 0.5, 0.5), max_iterations=1)
    assert abs(few.mean_clean - fitted.mean_clean) > 1e-3


def test_the_posterior_stays_exact_far_in_the_tails_and_an_empty_component_is_never_chosen():
    # Narrow components (sd 0.01) at 0 and 1: a loss of 0.5 is equidistant, so with equal weights its
    # posterior is 1/2 although both densities (exp(-1250)) underflow next to the other rows'.
    narrow = NoiseFilter(0.0, 1.0, 1e-4, 1e-4, 0.5, 0.5)
    np.testing.assert_array_equal(clean_posterior(np.array([0.0, 0.5, 1.0]), narrow), [1.0, 0.5, 0.0])
    # A filter fitted to losses without spread has an empty noisy component (weight 0): every sample
    # is clean, and log(0) is expected, not a numerical warning.
    empty = NoiseFilter(0.3, 1.0, 1e-6, 1e-6, 1.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(clean_posterior(np.array([0.3, 0.9, 1.0]), empty), [1.0, 1.0, 1.0])


def test_min_max_works_in_double_precision_on_single_precision_losses():
    losses = np.array([0.1, 0.2, 0.7], dtype=np.float32)
    exact = [(float(v) - float(losses[0])) / (float(losses[2]) - float(losses[0])) for v in losses]
    scaled = min_max(losses)
    assert scaled.dtype == np.float64
    np.testing.assert_allclose(scaled, exact, rtol=1e-15)


def test_the_filter_orders_its_components_by_mean_and_keeps_the_given_order_on_a_tie():
    means, variances, weights = np.array([0.8, 0.2]), np.array([0.01, 0.04]), np.array([0.3, 0.7])
    assert NoiseFilter.ordered(means, variances, weights) == NoiseFilter(0.2, 0.8, 0.04, 0.01, 0.7, 0.3)
    assert NoiseFilter.ordered(means[::-1], variances[::-1], weights[::-1]) == NoiseFilter(0.2, 0.8, 0.04, 0.01,
                                                                                           0.7, 0.3)
    tie = NoiseFilter.ordered(np.array([0.5, 0.5]), variances, weights)
    assert tie == NoiseFilter(0.5, 0.5, 0.01, 0.04, 0.3, 0.7)


def test_losses_without_spread_give_one_component_and_two_losses_one_each_at_the_variance_floor():
    # Nothing to separate: every sample in the clean component at the losses' mean, the noisy one empty.
    assert fit_filter(np.array([0.4, 0.4, 0.4]), seed=0) == NoiseFilter(pytest.approx(0.4), 1.0, 1e-6, 1e-6, 1.0, 0.0)
    assert fit_filter(np.array([0.7]), seed=0) == NoiseFilter(0.7, 1.0, 1e-6, 1e-6, 1.0, 0.0)
    # Two distinct losses: EM puts a component on each, with variance 0 plus the 1e-6 floor.
    two = fit_filter(np.array([0.9, 0.1]), seed=0)
    assert asdict(two) == pytest.approx(asdict(NoiseFilter(0.1, 0.9, 1e-6, 1e-6, 0.5, 0.5)), rel=1e-9, abs=1e-12)


def one_em_step(x: np.ndarray, means, variances, weights) -> NoiseFilter:
    """EM's first step by hand from the given parameters: Bayes responsibilities of the two Gaussians
    (E), then each component's share, weighted mean and weighted variance plus the 1e-6 floor (M)."""
    means, variances, weights = (np.asarray(v, dtype=np.float64) for v in (means, variances, weights))
    density = np.exp(-(x[:, None] - means) ** 2 / (2 * variances)) / np.sqrt(2 * np.pi * variances)
    joint = weights * density
    resp = joint / joint.sum(axis=1, keepdims=True)
    share = resp.sum(axis=0)
    new_means = (resp * x[:, None]).sum(axis=0) / share
    new_vars = (resp * (x[:, None] - new_means) ** 2).sum(axis=0) / share + 1e-6
    return NoiseFilter.ordered(new_means, new_vars, share / len(x))


def test_the_local_em_starts_from_the_global_filter():
    x = np.array([0.0, 0.1, 0.2, 0.6, 0.9, 1.0])
    start = NoiseFilter(0.2, 0.8, 0.04, 0.01, 0.7, 0.3)
    expected = one_em_step(x, [0.2, 0.8], [0.04, 0.01], [0.7, 0.3])
    assert asdict(fit_filter(x, seed=0, start=start, max_iterations=1)) == pytest.approx(asdict(expected), rel=1e-9)
    # An empty component of the global filter is revived with weight 1e-6 (renormalised), not dropped.
    empty = replace(start, weight_clean=1.0, weight_noisy=0.0)
    revived = one_em_step(x, [0.2, 0.8], [0.04, 0.01], np.array([1.0, 1e-6]) / (1 + 1e-6))
    assert asdict(fit_filter(x, seed=0, start=empty, max_iterations=1)) == pytest.approx(asdict(revived), rel=1e-6)
    # Single-precision losses are fitted in double precision: the same step on their exact values.
    x32 = x.astype(np.float32)
    exact = one_em_step(x32.astype(np.float64), [0.2, 0.8], [0.04, 0.01], [0.7, 0.3])
    assert asdict(fit_filter(x32, seed=0, start=start, max_iterations=1)) == pytest.approx(asdict(exact), rel=1e-12)


def test_filters_average_with_size_weights_and_squared_weights_narrow_the_variances():
    a = NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2)
    b = NoiseFilter(0.3, 0.9, 0.03, 0.04, 0.6, 0.4)
    linear = aggregate_filters([a, b], [30.0, 10.0])
    assert linear.mean_clean == pytest.approx(0.75 * 0.1 + 0.25 * 0.3)
    assert linear.var_noisy == pytest.approx(0.75 * 0.02 + 0.25 * 0.04)
    assert linear.weight_noisy == pytest.approx(0.75 * 0.2 + 0.25 * 0.4)
    squared = aggregate_filters([a, b], [30.0, 10.0], squared_weights=True)
    assert squared.mean_clean == linear.mean_clean
    assert squared.var_clean == pytest.approx(0.75 ** 2 * 0.01 + 0.25 ** 2 * 0.03)


def test_the_sampler_keeps_candidates_whose_global_and_debiased_local_predictions_agree():
    logits = torch.tensor([[2.0, 1.8], [0.0, 1.0], [3.0, 0.0], [1.0, 1.05]])
    prior = np.array([0.8, 0.2])
    # xi = 0.5: logits - 0.5 log(prior) = logits + (0.1116, 0.8047).
    local = debiased_labels(logits, prior, xi=0.5)
    np.testing.assert_array_equal(local, [1, 1, 0, 1])
    np.testing.assert_array_equal(debiased_labels(logits, prior, xi=0.0), [0, 1, 0, 1])
    global_labels = np.array([0, 1, 0, 0])
    np.testing.assert_array_equal(consistent(np.array([0, 1, 2, 3]), global_labels, local), [1, 2])
    np.testing.assert_array_equal(consistent(np.array([1, 3]), global_labels, local), [1])


def test_the_local_prior_is_a_moving_average_of_the_mean_prediction():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # softmax (0.5, 0.5) and (0.75, 0.25)
    prior = np.array([0.5, 0.5])
    np.testing.assert_allclose(updated_prior(prior, logits, momentum=0.2, xi=0.5),
                               0.2 * prior + 0.8 * np.array([0.625, 0.375]))
    # With a confidence bar only the confident row counts; none confident keeps the prior.
    np.testing.assert_allclose(updated_prior(prior, logits, 0.2, 0.0, confidence=0.7),
                               0.2 * prior + 0.8 * np.array([0.75, 0.25]))
    np.testing.assert_allclose(updated_prior(prior, logits, 0.2, 0.0, confidence=0.9), prior)


def test_the_uniform_prior_penalty_is_kl_from_uniform_to_the_mean_prediction():
    logits = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])  # mean prediction (0.75, 0.25)
    expected = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert uniform_prior_penalty(logits).item() == pytest.approx(expected, rel=1e-6)
    assert uniform_prior_penalty(torch.zeros(3, 4)).item() == pytest.approx(0.0, abs=1e-7)


def test_the_codes_double_softmax_loss_is_bounded_and_spreads_what_ce_squeezes():
    # Given label 0 throughout; row 3 is a confident wrong prediction, CE's outlier.
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.0, 0.0], [math.log(2.0), 0.0, -30.0], [-20.0, 20.0, 0.0]])
    labels = np.array([0, 0, 0, 0])
    ce = torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long), reduction="none").numpy()
    np.testing.assert_allclose(filter_losses(logits, labels, "ce"), (ce - ce.min()) / (ce.max() - ce.min()), rtol=1e-5)
    p = torch.softmax(logits, dim=1).double().numpy()
    raw = np.log(np.exp(p).sum(axis=1)) - p[:, 0]  # -log softmax(p)_0
    # Bounded: p_y = 1 gives log(e + 2) - 1, p_y = 0 with one class at 1 gives log(e + 2).
    assert raw[3] == pytest.approx(math.log(math.e + 2), abs=1e-6)
    double = filter_losses(logits, labels, "softmax_ce")
    np.testing.assert_allclose(double, (raw - raw.min()) / (raw.max() - raw.min()), rtol=1e-5)
    # Row 2 has p_y = 2/3: CE's outlier squeezes it to 0.01, the bounded loss leaves it a quarter of the range.
    assert filter_losses(logits, labels, "ce")[2] < 0.02 and double[2] > 0.2


def test_the_codes_random_start_is_two_halves_of_the_unit_interval_per_seed():
    f = random_filter(3)
    assert f.mean_clean == pytest.approx(0.25, abs=0.05) and f.mean_noisy == pytest.approx(0.75, abs=0.05)
    assert f.weight_clean == pytest.approx(0.5, abs=0.1)
    assert random_filter(3) == f and random_filter(4) != f
    # The seed also fixes the k-means start of EM: unseeded, about 4 fits in 10 of these numbers end
    # elsewhere, so a dozen repeats would all agree only by a rare chance.
    assert all(random_filter(3) == f for _ in range(12))


# Five samples, given labels 0 1 2 0 1; the global model is confident (0.9, on class 1) about sample 2.
LABELS = np.array([0, 1, 2, 0, 1])
PROBS = np.array([[0.6, 0.2, 0.2], [0.1, 0.8, 0.1], [0.05, 0.9, 0.05], [0.4, 0.3, 0.3], [0.3, 0.4, 0.3]])


@pytest.mark.parametrize(("params", "clean", "participations", "candidates", "relabeled", "sampler"), [
    # Eq. 11: clean samples plus confident noisy ones, relabelled; a clean client keeps everything.
    (client_settings(), [1, 1, 0, 0, 1], 0, [0, 1, 2, 4], [2], True),
    (client_settings(), [1, 1, 1, 1, 1], 0, [0, 1, 2, 3, 4], [], False),
    (client_settings(relabel=False), [1, 1, 0, 0, 1], 0, [0, 1, 4], [], True),
    (client_settings(pcs=False), [1, 1, 0, 0, 1], 0, [0, 1, 2, 4], [2], False),
    # The code's rules: clean samples only before the 5th participation, and while delta_hat <= 0.2.
    (client_settings(pcs_code_rules=True), [1, 1, 0, 0, 1], 4, [0, 1, 4], [], False),
    (client_settings(pcs_code_rules=True), [1, 1, 0, 0, 1], 5, [0, 1, 2, 4], [2], True),
    (client_settings(pcs_code_rules=True), [1, 1, 0, 1, 1], 5, [0, 1, 3, 4], [], True),
])
def test_the_selection_follows_eq_11_and_the_codes_rules(params, clean, participations, candidates, relabeled,
                                                         sampler):
    chosen = select(params, LABELS, np.array(clean, dtype=bool), PROBS, participations)
    np.testing.assert_array_equal(chosen.candidates, candidates)
    np.testing.assert_array_equal(np.flatnonzero(chosen.relabeled), relabeled)
    assert chosen.sampler is sampler
    expected = LABELS.copy()
    expected[relabeled] = 1
    np.testing.assert_array_equal(chosen.train_labels, expected)


def test_a_balanced_split_keeps_the_clients_clean_share_in_every_label_by_smallest_loss():
    # 12 samples: label 0 (6 samples) is easy, label 1 (4) is confused, label 2 (2) in between. The
    # filter flags 6 noisy: 2 of label 0's, 3 of label 1's (all but its clean-looking sample 7), 1 of label 2's.
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    losses = np.array([.1, .2, .05, .3, .9, .8, .6, .4, .7, .65, .5, .95])
    clean = losses <= 0.5
    assert noise_share(clean) == 0.5
    split = balanced(clean, losses, labels)
    # Half of each label: 3 of label 0, 2 of label 1, 1 of label 2, each its smallest losses.
    np.testing.assert_array_equal(np.flatnonzero(split), [0, 1, 2, 6, 7, 10])
    assert noise_share(split) == noise_share(clean), "the client's estimated noise level is unchanged"
    # Uneven quotas: 7 clean of 12 is 3.5, 2.33 and 1.17; the largest remainder (label 0's) is rounded up.
    seven = balanced(losses < 0.62, losses, labels)
    assert seven.sum() == 7
    assert [int(seven[labels == label].sum()) for label in (0, 1, 2)] == [4, 2, 1]
    assert balanced(np.ones(12, dtype=bool), losses, labels).all()
    assert not balanced(np.zeros(12, dtype=bool), losses, labels).any()


def test_the_diagnostics_count_the_split_the_relabels_and_each_true_class_kept_and_mislabelled():
    truth = np.array([0, 0, 1, 1, 2, -1])  # the last sample's truth is unknown
    given = np.array([0, 1, 1, 2, 2, 0])  # samples 1 and 3 are wrong
    clean = np.array([True, False, True, False, True, True])
    relabeled = np.array([False, True, False, True, False, False])
    train_labels = np.array([0, 0, 1, 0, 2, 0])  # sample 1 relabelled right, sample 3 wrong
    d = diagnostics(truth, given, clean, relabeled, train_labels, np.array([0, 1, 3, 5]), num_classes=3)
    assert (d.known, d.wrong, d.split_tp, d.split_fp, d.split_fn, d.split_tn) == (5, 2, 2, 0, 0, 3)
    assert d.relabeled_correct == 1 and d.trained_wrong == 1
    assert d.class_known == (2, 2, 1) and d.class_trained == (2, 1, 0) and d.class_trained_wrong == (0, 1, 0)


def test_the_codes_extra_pass_moves_batch_norm_statistics_and_not_the_loss():
    from data.transforms import BatchTransform, TransformSpec

    transform = BatchTransform(TransformSpec(), [0.5], [0.5], train=True)
    images = torch.randint(0, 256, (8, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    results = []
    for extra in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)).train()
        batch = Batch(images, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), transform, torch.Generator().manual_seed(1))
        loss = MixupUniformPrior(1.0, 0.0, torch.Generator().manual_seed(2), extra_forward=extra)(model, batch)
        norm = model[2]
        results.append((float(loss.objective.detach()), norm.running_mean.clone(), int(norm.num_batches_tracked)))
    (plain_loss, plain_mean, plain_count), (extra_loss, extra_mean, extra_count) = results
    assert extra_loss == pytest.approx(plain_loss, rel=1e-6)
    assert (plain_count, extra_count) == (1, 2) and not torch.allclose(plain_mean, extra_mean)


class ConstantLogits(nn.Module):
    """The same logits whatever the input (plus 0 * x, so the input is used); counts its forward passes."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.logits + 0 * x.sum()


def float_batch(labels: list[int], images: torch.Tensor | None = None) -> Batch:
    """A batch whose transform only turns the uint8 images into floats."""
    images = torch.zeros(len(labels), 1, 2, 2, dtype=torch.uint8) if images is None else images
    return Batch(images, torch.tensor(labels), lambda images, generator=None: images.float(), torch.Generator())


def test_without_mixing_the_objective_is_cross_entropy_plus_eta_times_the_penalty_in_one_pass():
    # Both rows predict (0.75, 0.25): labels 0 and 1 give CE (-log 0.75 - log 0.25) / 2, and the
    # penalty is the KL of the test above; eta = 2.
    model = ConstantLogits(torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]]))
    loss = MixupUniformPrior(0.0, 2.0, torch.Generator().manual_seed(0))(model, float_batch([0, 1]))
    ce = -(math.log(0.75) + math.log(0.25)) / 2
    penalty = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert loss.reported.item() == pytest.approx(ce, rel=1e-6)
    assert loss.objective.item() == pytest.approx(ce + 2.0 * penalty, rel=1e-6)
    assert model.calls == 1, "no extra pass unless asked for"


def test_eta_zero_is_the_plain_loss_even_where_the_penalty_is_infinite():
    # exp(-200) underflows in float32: no row gives class 1 any mass, so the penalty is +inf; eta = 0
    # must leave the loss as it is (0 here: class 0 has all the mass), not add 0 * inf = nan.
    model = ConstantLogits(torch.tensor([[0.0, -200.0], [0.0, -200.0]]))
    assert uniform_prior_penalty(model.logits.detach()).item() == math.inf
    loss = MixupUniformPrior(0.0, 0.0, torch.Generator().manual_seed(0))(model, float_batch([0, 0]))
    assert loss.objective.item() == 0.0 and loss.reported.item() == 0.0


def test_with_mixing_the_loss_is_mixups_on_the_same_draws():
    # The learner is Mixup plus the penalty: at eta = 0 it reports what Mixup does with the same
    # stream (lambda and partners), which the plain cross-entropy of the unmixed batch is not.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    images = torch.arange(24, dtype=torch.uint8).reshape(6, 1, 2, 2)
    labels = [0, 1, 2, 0, 1, 2]
    ours = MixupUniformPrior(1.0, 0.0, torch.Generator().manual_seed(2))(model, float_batch(labels, images))
    mixup = Mixup(1.0, torch.Generator().manual_seed(2))(model, float_batch(labels, images))
    plain = nn.functional.cross_entropy(model(images.float()), torch.tensor(labels))
    assert ours.reported.item() == pytest.approx(mixup.reported.item(), rel=1e-6)
    assert ours.reported.item() != pytest.approx(plain.item(), rel=1e-3)


TRAINING = local_training(lr=0.01, epochs=1, batch_size=4)



def feddiv(warmup_iterations: int = 0, warmup_schedule: str = "sequential", filter_scope: str = "all") -> FedDiv:
    settings = strategy_settings("feddiv", num_rounds=3, fraction=0.5, train=TRAINING,
                                 warmup_iterations=warmup_iterations, warmup_schedule=warmup_schedule,
                                 params=client_settings(filter_scope=filter_scope))
    strategy = FedDiv(settings, context(num_clients=4))
    strategy.bind(Federation(node_of={pid: 100 + pid for pid in range(4)}, num_examples=dict.fromkeys(range(4), 10)))
    return strategy


def filter_replies(filters: dict[int, NoiseFilter], size: int = 10) -> dict[int, TrainReply]:
    return {pid: TrainReply(ArrayRecord({"w": Array(np.zeros(2, np.float32))}), TrainStats(size, 0.1, 1),
                            FedDivRes(filter=f, noise_estimate=0.2, relabeled=0, trained=size))
            for pid, f in filters.items()}


def test_the_global_filter_averages_every_client_seen_or_only_this_rounds():
    a, b, c = (NoiseFilter(m, m + 0.5, 0.01, 0.02, 0.7, 0.3) for m in (0.1, 0.2, 0.4))
    for round_only, second in ((False, aggregate_filters([a, b, c], [10.0] * 3)), (True, c)):
        strategy = feddiv(filter_scope="round" if round_only else "all")
        strategy.stage = MAIN
        strategy.aggregate(filter_replies({0: a, 1: b}))
        assert strategy.global_filter == aggregate_filters([a, b], [10.0, 10.0])
        strategy.aggregate(filter_replies({2: c}))
        assert asdict(strategy.global_filter) == pytest.approx(asdict(second))


@pytest.mark.parametrize(("sampled", "sizes"), [(False, [1, 1, 1, 1, 1, 1, 1, 1]), (True, [2, 2, 2, 2])])
def test_the_warmup_visits_one_client_at_a_time_or_samples_rounds(flower_identity, sampled, sizes):
    strategy = feddiv(warmup_iterations=2, warmup_schedule="rounds" if sampled else "sequential")
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    visits = []
    for server_round in range(1, len(sizes) + 1):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), None))
        visits.append(sorted(strategy.federation.partition_of(m.metadata.dst_node_id) for m in messages))
    assert [len(v) for v in visits] == sizes and strategy.stage == "warmup"
    if not sampled:  # two iterations, each a permutation of all four clients
        assert sorted(sum(visits[:4], [])) == sorted(sum(visits[4:], [])) == [0, 1, 2, 3]
    list(strategy.configure_train(len(sizes) + 1, arrays, ConfigRecord(), None))
    assert strategy.stage == MAIN and strategy.planned_rounds() == len(sizes) + 3


def test_options_and_report_travel_through_the_codec():
    options = FedDivIns(phase="main", params=client_settings(), filter=NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2),
                        eta=1.0, seed=3)
    record = encode(options)
    assert record["filter.mean-clean"] == 0.1 and record["zeta"] == 0.75 and record["filter-init"] == "local_bootstrap"
    assert decode(FedDivIns, record, "the server") == options
    no_filter = FedDivIns(phase="main", params=client_settings(), eta=0.0)
    assert decode(FedDivIns, encode(no_filter), "the server").filter is None
    report = FedDivRes(filter=NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2), noise_estimate=0.25, relabeled=3,
                          trained=40)
    assert decode(FedDivRes, encode(report), "client 1") == report


@pytest.mark.parametrize(("overrides", "message"), [
    ("strategy.train.learner=sce", r"strategy.train.learner='sce' is invalid: ce: FedDiv's clients"),
    ("strategy.zeta=1.5", r"strategy.zeta=1.5 is invalid"),
    ("strategy.variance_aggregation=cubic", r"strategy.variance_aggregation='cubic' is invalid: allowed are linear"),
    ("strategy.filter_loss=mse", r"strategy.filter_loss='mse' is invalid: allowed are ce, softmax_ce"),
    ("strategy.warmup_schedule=random",
     r"strategy.warmup_schedule='random' is invalid: allowed are sequential, rounds"),
    ("strategy.pcs_code_rules=maybe", r"strategy.pcs_code_rules='maybe' is invalid"),
    # As rounds of 3, one warm-up iteration of 10 clients takes 4 rounds: 12 participations.
    ("comm_budget=13 strategy.warmup_schedule=rounds strategy.fraction=0.3",
     r"comm_budget=13 is invalid: too small; FedDiv's warm-up spends 12 participations"),
    # smoke: one warm-up iteration of 10 clients, then rounds of 3.
    ("comm_budget=5", r"comm_budget=5 is invalid: too small; FedDiv's warm-up alone spend 10"),
    ("comm_budget=12", r"comm_budget=12 is invalid: too small; FedDiv's warm-up spends 10 participations and "
                       r"leaves no"),
    ("strategy.min_clients=11", r"strategy.min_clients=11 is invalid: allowed is at most num_clients=10"),
])
def test_bad_settings_are_one_clear_error(overrides, message):
    from server.config import load_run
    from settings.compose import compose_config

    with pytest.raises(ConfigError, match=message):
        load_run(compose_config(["experiment=smoke", "strategy=feddiv", *overrides.split()]))


def test_a_smoke_run_warms_up_then_filters_and_finds_noisy_clients_better_than_chance(run_inprocess):
    payload, _ = run_inprocess("experiment=smoke strategy=feddiv strategy.warmup_iterations=1 "
                               "strategy.num_rounds=8 strategy.fraction=0.3")
    stages = [row["stage"] for row in payload["rounds"]]
    assert stages == ["warmup"] * 10 + ["main"] * 8
    assert [len(row["clients"]) for row in payload["rounds"]] == [1] * 10 + [3] * 8
    assert payload["summary"]["comm_cost"] == 10 + 24
    block = payload["feddiv"]
    assert len(block["global_filters"]) == 8
    f = block["global_filter"]
    assert f["mean_clean"] < f["mean_noisy"]
    assert abs(f["weight_clean"] + f["weight_noisy"] - 1) < 1e-9
    truth = set(block["true_noisy_clients"])
    # Every client's estimate above the threshold counts as detected; with ground truth, scored.
    estimates = {int(pid): value for pid, value in block["noise_estimates"].items()}
    assert set(block["detected_noisy_clients"]) == {pid for pid, value in estimates.items() if value >= 0.1}
    # Better than chance: the |truth| highest noise estimates hold more noisy clients than a random pick.
    highest = sorted(estimates, key=lambda pid: -estimates[pid])[:len(truth)]
    assert len(set(highest) & truth) > len(truth) ** 2 / 10
    # The filter flags wrong labels far more precisely than their share, and training sees less noise.
    given = block["label_noise"]["given"]
    assert block["sample_split"]["precision"] > 2 * given
    assert block["label_noise"]["trained"] < given
    assert block["relabeled"] > 0 and block["relabel_precision"] > 0.5
    kept, mislabelled = block["per_class"]["kept"], block["per_class"]["trained_wrong"]
    assert len(kept) == len(mislabelled) == 10 and all(0.0 <= v <= 1.0 for v in kept + mislabelled)


@pytest.mark.parametrize("pcs_mode", ["epoch", "cached"])
def test_the_client_state_survives_a_restarted_supernode_and_training_continues_identically(
        prepared_run, incoming, tmp_path, pcs_mode):
    from flwr.app import Context, RecordDict

    from client import app as client_app
    from client import node as client_node
    from client.plugins.feddiv import load_state
    from protocol.messages import StateScope, TrainIns, instruction, read_arrays, read_extra, with_scope

    overrides, _, arrays = prepared_run("experiment=smoke strategy=feddiv")
    params = client_settings(pcs_mode=pcs_mode)

    def context(state_dir) -> Context:
        config = {"partition-id": 4, **({"state-dir": str(state_dir)} if state_dir else {})}
        return Context(run_id=1, node_id=77, node_config=config, state=RecordDict(),
                       run_config={"overrides": overrides})

    def scoped(content: RecordDict, scope: StateScope | None) -> RecordDict:
        return content if scope is None else with_scope(content, scope)

    def train(ctx: Context, server_round: int, scope: StateScope | None = None) -> ArrayRecord:
        options = FedDivIns(phase="main", params=params, eta=0.0, filter=NoiseFilter(0.1, 0.6, 0.01, 0.05, 0.7, 0.3),
                                seed=1)
        content = instruction(TrainIns(server_round, local_training(lr=0.05, epochs=2, batch_size=16), plugin="feddiv"),
                              arrays=arrays, plugin_ins=options, plugin="feddiv")
        reply = client_app.train(incoming(scoped(content, scope), "train"), ctx)
        report = read_extra(reply.content, "feddiv", FedDivRes, "client 4")
        assert 0.0 <= report.noise_estimate <= 1.0 and report.filter.mean_clean <= report.filter.mean_noisy
        return read_arrays(reply.content, "client 4")

    def state_in(ctx: Context, scope: StateScope):
        """The state the node reads while handling an instruction of ``scope``."""
        return load_state(ctx, client_app.node_for(incoming(scoped(RecordDict(), scope), "train"), ctx))

    kept = context(None)  # in memory: instructions without a scope on a node without a state-dir
    train(kept, 1)
    state = load_state(kept, client_node.load_node(kept))
    assert state.prior.shape == (10,) and state.prior.sum() == pytest.approx(1.0) and not np.allclose(state.prior, 0.1)
    assert state.participations == 1
    size = len(client_node.load_node(kept).data.labels)
    # The cached sampler keeps the trained model's de-biased labels, on the client only.
    assert (state.debiased is None) if pcs_mode == "epoch" else (state.debiased.shape == (size,))
    expected = train(kept, 2).to_torch_state_dict()

    first = context(tmp_path)
    train(first, 1, StateScope(run="r1", round=1))
    assert [p.relative_to(tmp_path).as_posix() for p in sorted(tmp_path.rglob("*.npz"))] == [
        "run-r1/partition-4/answered/r0000001-a1.npz", "run-r1/partition-4/feddiv-state/r0000001-a1.npz"]
    assert "feddiv-state" not in first.state.array_records, "on disk, not in context.state"
    restarted = context(tmp_path)  # an empty context.state: the state comes from the disk
    again_state = state_in(restarted, StateScope(run="r1", round=2))
    np.testing.assert_allclose(again_state.prior, state.prior)
    assert again_state.participations == 1
    if pcs_mode == "cached":
        np.testing.assert_array_equal(again_state.debiased, state.debiased)
    # Another run on the same node starts with a fresh state.
    assert state_in(context(tmp_path), StateScope(run="r2", round=1)).participations == 0
    again = train(restarted, 2, StateScope(run="r1", round=2)).to_torch_state_dict()
    assert all(torch.equal(again[key], expected[key]) for key in expected)
    # The round's version replaces the one before (the server keeps no checkpoint that needs it); only a
    # handled instruction is an answer, so reading run r2's state wrote nothing there.
    assert [p.relative_to(tmp_path).as_posix() for p in sorted(tmp_path.rglob("*.npz"))] == [
        "run-r1/partition-4/answered/r0000002-a1.npz", "run-r1/partition-4/feddiv-state/r0000002-a1.npz"]


def test_a_smoke_run_with_the_released_codes_switches_runs_its_schedule_and_still_filters(run_inprocess):
    payload, _ = run_inprocess(
        "experiment=smoke strategy=feddiv strategy.warmup_iterations=1 strategy.num_rounds=6 strategy.fraction=0.3 "
        "strategy.warmup_schedule=rounds strategy.filter_loss=softmax_ce strategy.filter_transform=train "
        "strategy.filter_scope=round strategy.filter_init=code_random strategy.pcs_mode=cached "
        "strategy.pcs_code_rules=true strategy.bn_extra_pass=true strategy.variance_aggregation=squared "
        "strategy.em_iters=3 strategy.prior_confidence=0.85 strategy.xi=0.2 strategy.momentum=0.5")
    # The warm-up as ordinary rounds: ceil(10 / 3) rounds of 3 sampled clients.
    assert [row["stage"] for row in payload["rounds"]] == ["warmup"] * 4 + ["main"] * 6
    assert [len(row["clients"]) for row in payload["rounds"]] == [3] * 10
    assert payload["summary"]["comm_cost"] == 30
    block = payload["feddiv"]
    f = block["global_filter"]
    assert 0.0 <= f["mean_clean"] < f["mean_noisy"] <= 1.0
    # The code's rules keep relabelling off until a client's 5th main-phase participation, which
    # 6 rounds of 3 out of 10 clients rarely reach; the filter still finds wrong labels.
    assert block["sample_split"]["precision"] > block["label_noise"]["given"]


def _report(wrong: int, flagged_wrong: int, flagged_right: int, diagnostics_sent: bool = True) -> FedDivRes:
    from protocol.feddiv import Diagnostics

    counts = Diagnostics(known=10, wrong=wrong, split_tp=flagged_wrong, split_fp=flagged_right,
                         split_fn=wrong - flagged_wrong, split_tn=10 - wrong - flagged_right, relabeled_correct=0,
                         trained_wrong=0)
    return FedDivRes(filter=NoiseFilter(0.2, 0.7, 0.01, 0.01, 0.6, 0.4), noise_estimate=0.3, relabeled=0, trained=10,
                     diagnostics=counts if diagnostics_sent else None)


def test_the_sample_split_is_null_with_the_reason_where_no_label_is_wrong_and_without_counts():
    from strategies.detection import NO_NOISY_REASON, missing_diagnostics
    from strategies.feddiv import NO_WRONG_LABEL_REASON, FedDivMonitor
    from strategies.ground_truth import GroundTruth

    def truth(noise: float) -> GroundTruth:
        return GroundTruth(noisy_clients=frozenset({0, 1}) if noise else frozenset(), true_noise={0: noise, 1: noise},
                           sizes={0: 10, 1: 10}, known={0: 10, 1: 10})

    clean = FedDivMonitor([0, 1], 0.1, truth(0.0))
    clean.round(1, {0: _report(0, 0, 3), 1: _report(0, 0, 2)}, NoiseFilter(0.2, 0.7, 0.01, 0.01, 0.6, 0.4))
    block = clean.results()
    assert block["sample_split"] is None and block["sample_split_not_applicable"] == NO_WRONG_LABEL_REASON
    assert block["detection"] is None and block["detection_not_applicable"] == NO_NOISY_REASON
    assert block["label_noise"] == {"given": 0.0, "trained": 0.0}
    noisy = FedDivMonitor([0, 1], 0.1, truth(0.3))
    noisy.round(1, {0: _report(3, 2, 1), 1: _report(3, 3, 0)}, NoiseFilter(0.2, 0.7, 0.01, 0.01, 0.6, 0.4))
    assert noisy.results()["sample_split"] == pytest.approx({"precision": 5 / 6, "recall": 5 / 6, "f1": 5 / 6})
    assert noisy.results()["detection"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    unsent = FedDivMonitor([0, 1], 0.1, truth(0.3))
    unsent.round(1, {0: _report(3, 2, 1), 1: _report(3, 3, 0, diagnostics_sent=False)},
                 NoiseFilter(0.2, 0.7, 0.01, 0.01, 0.6, 0.4))
    block = unsent.results()
    assert block["label_noise_not_available"] == missing_diagnostics([1])
    assert block["sample_split"] is None and block["label_noise"] is None and block["relabel_precision"] is None
    assert block["noise_estimate_mae"] == pytest.approx(0.0), "delta_hat against the scene's own truth"
