"""FedCorr's client-side correction: loss GMM split, stage-1 and stage-2 relabelling."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest

from common.errors import ConfigError
from task.correction import loss_split, stage1_relabel, stage2_relabel

CLASSES = 10


def _mixture_losses(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """800 clean losses ~ N(0.3, 0.1) and 200 noisy ~ N(2.5, 0.5), shuffled; returns (losses, truth)."""
    rng = np.random.default_rng(seed)
    losses = np.concatenate([rng.normal(0.3, 0.1, 800), rng.normal(2.5, 0.5, 200)]).clip(min=0.0)
    truth = np.arange(1000) >= 800
    order = rng.permutation(1000)
    return losses[order], truth[order]


def _exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


class _Client:
    """A synthetic client: true labels, 30% flipped to a wrong class, and a mostly right global model."""

    def __init__(self, seed: int, n: int = 500) -> None:
        rng = np.random.default_rng(seed)
        self.true = rng.integers(0, CLASSES, n)
        self.is_noisy = rng.random(n) < 0.3
        self.labels = self.true.copy()
        # A noisy label is always a wrong class: shifted by 1..CLASSES-1.
        shift = rng.integers(1, CLASSES, n)
        self.labels[self.is_noisy] = (self.true + shift)[self.is_noisy] % CLASSES
        # The global model is right on 90% of the samples, and less sure where it is wrong.
        right = rng.random(n) < 0.9
        predicted = np.where(right, self.true, (self.true + rng.integers(1, CLASSES, n)) % CLASSES)
        confidence = np.where(right, rng.uniform(0.4, 1.0, n), rng.uniform(0.2, 0.7, n))
        self.probabilities = np.full((n, CLASSES), 0.0)
        self.probabilities += ((1 - confidence) / (CLASSES - 1))[:, None]
        self.probabilities[np.arange(n), predicted] = confidence
        self.losses = -np.log(self.probabilities[np.arange(n), self.labels])


def test_loss_split_finds_the_large_loss_population() -> None:
    losses, truth = _mixture_losses(seed=0)
    noisy = loss_split(losses, seed=0)
    assert noisy.dtype == np.bool_ and noisy.shape == (1000,)
    true_positives = (noisy & truth).sum()
    assert true_positives / truth.sum() >= 0.95  # recall
    assert true_positives / noisy.sum() >= 0.95  # precision


def test_loss_split_is_decided_by_the_seed_where_the_losses_leave_it_open() -> None:
    # Three equal populations: the mixture joins the middle one to the low or the high one depending on
    # its initialisation, so only the seed makes a client's split reproducible.
    rng = np.random.default_rng(1)
    losses = np.concatenate([rng.normal(mean, 0.05, 100) for mean in (0.0, 1.0, 2.0)])
    splits = {seed: loss_split(losses, seed=seed) for seed in range(10)}
    assert {int(split.sum()) for split in splits.values()} == {100, 200}
    for seed, split in splits.items():
        for _ in range(2):
            np.testing.assert_array_equal(loss_split(losses, seed=seed), split)


@pytest.mark.parametrize(
    "losses", [np.full(50, 0.7), 0.7 + np.linspace(0.0, 1e-9, 50), np.array([3.0]), np.array([])]
)
def test_loss_split_without_two_populations_marks_nobody(losses: np.ndarray) -> None:
    noisy = loss_split(losses, seed=0)
    assert noisy.shape == losses.shape and not noisy.any()


def test_loss_split_does_not_modify_the_losses() -> None:
    losses, _ = _mixture_losses(seed=2)
    before = losses.copy()
    loss_split(losses, seed=0)
    np.testing.assert_array_equal(losses, before)


def test_stage1_estimates_the_noise_level_and_relabels_the_confident_top_losses() -> None:
    client = _Client(seed=3)
    noisy = loss_split(client.losses, seed=0)
    new_labels, mu_hat, changed = stage1_relabel(
        client.labels, client.losses, client.probabilities, noisy, pi=0.5, theta=0.5
    )
    assert mu_hat == noisy.sum() / len(noisy)
    # Eq. (6): the floor(pi * |D_n|) largest losses of D_n are the only candidates.
    rows = np.flatnonzero(noisy)
    candidates = rows[np.argsort(-client.losses[rows], kind="stable")][: math.floor(0.5 * rows.size)]
    confident = candidates[client.probabilities[candidates].max(axis=1) >= 0.5]
    argmax = client.probabilities.argmax(axis=1)
    expected = confident[argmax[confident] != client.labels[confident]]
    np.testing.assert_array_equal(changed, np.sort(expected))
    np.testing.assert_array_equal(new_labels[changed], argmax[changed])
    untouched = np.setdiff1d(np.arange(len(noisy)), changed)
    np.testing.assert_array_equal(new_labels[untouched], client.labels[untouched])
    # With a mostly right global model the relabelled samples mostly get their true class back
    # (measured: 0.91 here, 0.81-0.95 over seeds 0-5); the label noise falls from 33% to 16%.
    assert changed.size > 30
    precision = (new_labels[changed] == client.true[changed]).mean()
    assert precision >= 0.8
    assert (new_labels != client.true).mean() < (client.labels != client.true).mean() - 0.1
    # A stricter threshold trades relabelled samples for precision: theta guards against over-correction.
    strict_labels, _, strict = stage1_relabel(
        client.labels, client.losses, client.probabilities, noisy, pi=0.5, theta=0.8
    )
    assert strict.size < changed.size
    assert (strict_labels[strict] == client.true[strict]).mean() > precision


def test_stage1_considers_exactly_floor_pi_of_the_noisy_subset() -> None:
    labels = np.zeros(10, dtype=np.int64)
    probabilities = np.tile(np.eye(3)[1], (10, 1))  # confidently class 1, every label is 0
    losses = np.arange(10, dtype=float)
    noisy = np.arange(10) >= 3  # |D_n| = 7
    _, mu_hat, changed = stage1_relabel(labels, losses, probabilities, noisy, pi=0.5, theta=0.9)
    assert mu_hat == 0.7
    np.testing.assert_array_equal(changed, [7, 8, 9])  # floor(3.5) = 3 largest losses
    # pi * |D_n| is 28.999999999999996 in floating point for 0.29 * 100; 29 samples are meant.
    labels, probabilities = np.zeros(100, dtype=np.int64), np.tile(np.eye(3)[1], (100, 1))
    _, _, changed = stage1_relabel(
        labels, np.arange(100.0), probabilities, np.ones(100, bool), pi=0.29, theta=0.9
    )
    assert changed.size == 29


def test_stage1_breaks_loss_ties_by_lower_index() -> None:
    # 200 noisy samples with three loss values: floor(0.5 * 200) = 100 candidates take the highest
    # losses, and among equal losses the lower indices; every candidate is relabelled here.
    losses = np.random.default_rng(12).integers(0, 3, 200).astype(float)
    labels, probabilities = np.zeros(200, dtype=np.int64), np.tile(np.eye(2)[1], (200, 1))
    _, _, changed = stage1_relabel(labels, losses, probabilities, np.ones(200, bool), pi=0.5, theta=0.9)
    expected = sorted(range(200), key=lambda i: (-losses[i], i))[:100]
    np.testing.assert_array_equal(changed, np.sort(expected))


def test_stage1_counts_pi_times_the_subset_to_nine_decimals() -> None:
    # The rounding that absorbs float error in pi * |D_n| works at 1e-9: 0.9999999998 of one sample is one.
    changed = stage1_relabel(np.array([0]), np.array([1.0]), np.array([[0.0, 1.0]]), np.ones(1, bool),
                             pi=1 - 2e-10, theta=0.5)[2]
    np.testing.assert_array_equal(changed, [0])


def test_stage1_edge_cases_relabel_nothing() -> None:
    client = _Client(seed=4)
    noisy = loss_split(client.losses, seed=0)
    for pi, theta in [(0.0, 0.0), (1.0, 1.0)]:  # no candidates; no prediction reaches certainty
        new_labels, _, changed = stage1_relabel(
            client.labels, client.losses, client.probabilities, noisy, pi=pi, theta=theta
        )
        assert changed.size == 0
        np.testing.assert_array_equal(new_labels, client.labels)
    _, mu_hat, changed = stage1_relabel(
        client.labels, client.losses, client.probabilities, np.zeros(len(noisy), bool), pi=1.0, theta=0.0
    )
    assert mu_hat == 0.0 and changed.size == 0


def test_stage1_does_not_modify_its_inputs() -> None:
    client = _Client(seed=5)
    noisy = loss_split(client.losses, seed=0)
    inputs = (client.labels, client.losses, client.probabilities, noisy)
    before = [array.copy() for array in inputs]
    new_labels, _, changed = stage1_relabel(*inputs, pi=1.0, theta=0.0)
    assert changed.size > 0 and new_labels is not client.labels
    for array, original in zip(inputs, before):
        np.testing.assert_array_equal(array, original)


def test_stage2_relabels_exactly_the_confident_samples() -> None:
    client = _Client(seed=6)
    before = client.labels.copy()
    new_labels, changed = stage2_relabel(client.labels, client.probabilities, theta=0.6)
    argmax = client.probabilities.argmax(axis=1)
    confident = client.probabilities.max(axis=1) >= 0.6
    np.testing.assert_array_equal(new_labels, np.where(confident, argmax, client.labels))
    np.testing.assert_array_equal(changed, np.flatnonzero(confident & (argmax != client.labels)))
    np.testing.assert_array_equal(client.labels, before)


def test_stage2_with_a_rows_mask_relabels_only_the_confident_samples_it_marks() -> None:
    client = _Client(seed=8)
    rows = np.arange(client.labels.size) % 3 == 0
    new_labels, changed = stage2_relabel(client.labels, client.probabilities, theta=0.6, rows=rows)
    argmax = client.probabilities.argmax(axis=1)
    relabel = rows & (client.probabilities.max(axis=1) >= 0.6)
    np.testing.assert_array_equal(new_labels, np.where(relabel, argmax, client.labels))
    np.testing.assert_array_equal(changed, np.flatnonzero(relabel & (argmax != client.labels)))
    assert changed.size > 0
    n = client.labels.size
    for bad in (np.arange(3), rows.astype(np.int64), np.ones(n + 1, dtype=bool)):  # shape, dtype, or both wrong
        with pytest.raises(ConfigError, match=rf"rows mask of shape \({bad.size},\) and dtype {bad.dtype} is "
                                              rf"invalid: allowed is a boolean array of shape \({n},\)"):
            stage2_relabel(client.labels, client.probabilities, theta=0.6, rows=bad)


def test_stage2_keep_leaves_a_label_the_model_finds_at_least_that_likely() -> None:
    client = _Client(seed=9)
    given = client.probabilities[np.arange(client.labels.size), client.labels]
    new_labels, changed = stage2_relabel(client.labels, client.probabilities, theta=0.5, keep=0.05)
    relabel = (client.probabilities.max(axis=1) >= 0.5) & (given < 0.05)
    argmax = client.probabilities.argmax(axis=1)
    np.testing.assert_array_equal(new_labels, np.where(relabel, argmax, client.labels))
    np.testing.assert_array_equal(changed, np.flatnonzero(relabel & (argmax != client.labels)))
    paper, _ = stage2_relabel(client.labels, client.probabilities, theta=0.5)
    kept = (paper != client.labels) & (given >= 0.05)
    assert kept.any() and changed.size > 0  # the rule keeps some of what the paper changes, not all
    # A label at exactly keep stays; with a rows mask the two rules combine.
    labels, probabilities = np.array([0, 0]), np.array([[0.25, 0.75], [0.2, 0.8]])
    np.testing.assert_array_equal(stage2_relabel(labels, probabilities, theta=0.5, keep=0.25)[0], [0, 1])
    np.testing.assert_array_equal(
        stage2_relabel(labels, probabilities, theta=0.5, keep=0.25, rows=np.array([True, False]))[0], [0, 0])
    for bad in (0.0, 1.5, -0.1, "high"):
        with pytest.raises(ConfigError, match="strategy.stage2_keep=.* is invalid"):
            stage2_relabel(labels, probabilities, theta=0.5, keep=bad)


def test_a_prediction_exactly_at_theta_is_confident() -> None:
    # Eq. (7) relabels where the max probability reaches theta.
    new_labels, changed = stage2_relabel(np.array([0, 0]), np.array([[0.25, 0.75], [0.3, 0.7]]), theta=0.75)
    np.testing.assert_array_equal(new_labels, [1, 0])
    np.testing.assert_array_equal(changed, [0])


def test_a_single_sample_and_a_single_class_are_valid_inputs() -> None:
    new_labels, changed = stage2_relabel(np.array([0]), np.array([[0.2, 0.8]]), theta=0.5)
    np.testing.assert_array_equal(new_labels, [1])
    np.testing.assert_array_equal(changed, [0])
    new_labels, changed = stage2_relabel(np.zeros(3, dtype=np.int64), np.ones((3, 1)), theta=1.0)
    np.testing.assert_array_equal(new_labels, [0, 0, 0])
    assert changed.size == 0


def test_stage2_threshold_extremes() -> None:
    client = _Client(seed=7)
    new_labels, changed = stage2_relabel(client.labels, client.probabilities, theta=0.0)
    np.testing.assert_array_equal(new_labels, client.probabilities.argmax(axis=1))
    assert changed.size > 0
    above_every_max = float(client.probabilities.max(axis=1).max()) + 1e-6
    new_labels, changed = stage2_relabel(
        client.labels, client.probabilities, theta=min(above_every_max, 1.0)
    )
    assert changed.size == 0
    np.testing.assert_array_equal(new_labels, client.labels)


@pytest.mark.parametrize(
    ("key", "value"), [("pi", -0.1), ("pi", 1.5), ("theta", 1.01), ("theta", "high")]
)
def test_stage1_rejects_pi_and_theta_outside_unit_interval(key: str, value: object) -> None:
    client = _Client(seed=8, n=20)
    params = {"pi": 0.5, "theta": 0.5, key: value}
    with pytest.raises(ConfigError, match=f"strategy.{key}="):
        stage1_relabel(client.labels, client.losses, client.probabilities, np.zeros(20, bool), **params)


@pytest.mark.parametrize("theta", [-0.5, 1.01])
def test_stage2_rejects_theta_outside_unit_interval(theta: float) -> None:
    client = _Client(seed=8, n=20)
    message = f"strategy.theta={theta} is invalid: allowed is a number >= 0.0 and <= 1.0"
    with pytest.raises(ConfigError, match=_exactly(message)):
        stage2_relabel(client.labels, client.probabilities, theta=theta)


def _shortened(array: np.ndarray) -> np.ndarray:
    return array[:-1]


@pytest.mark.parametrize(
    ("field", "change", "match"),
    [
        ("labels", lambda labels: labels.astype(float), "labels of shape"),
        ("losses", _shortened, "losses of shape"),
        ("probabilities", _shortened, "probabilities of shape"),
        ("noisy", _shortened, "noisy mask"),
        ("noisy", lambda noisy: noisy.astype(int), "noisy mask"),
    ],
)
def test_stage1_rejects_inconsistent_inputs(
    field: str, change: Callable[[np.ndarray], np.ndarray], match: str
) -> None:
    client = _Client(seed=9, n=20)
    args = {
        "labels": client.labels,
        "losses": client.losses,
        "probabilities": client.probabilities,
        "noisy": np.zeros(20, bool),
    }
    args[field] = change(args[field])
    with pytest.raises(ConfigError, match=match):
        stage1_relabel(**args, pi=0.5, theta=0.5)


def test_probabilities_and_labels_must_fit_each_other() -> None:
    labels = np.array([0, 1, 2])
    with pytest.raises(ConfigError, match="softmax outputs, not logits"):
        stage2_relabel(labels, np.array([[2.0, -1.0, 0.5]] * 3), theta=0.5)
    with pytest.raises(ConfigError, match="label 2 is invalid"):
        stage2_relabel(labels, np.full((3, 2), 0.5), theta=0.5)
    with pytest.raises(ConfigError, match="finite real numbers"):
        losses = np.array([0.1, np.inf, 0.2])
        stage1_relabel(labels, losses, np.full((3, 3), 1 / 3), np.ones(3, bool), pi=0.5, theta=0.5)


_UNIFORM = np.full((3, 3), 1 / 3)


@pytest.mark.parametrize(
    ("labels", "probabilities", "message"),
    [
        (np.zeros((3, 1), dtype=np.int64), _UNIFORM,
         "labels of shape (3, 1) and dtype int64 are invalid: allowed is a non-empty 1-D integer array"),
        (np.zeros(0, dtype=np.int64), np.zeros((0, 3)),
         "labels of shape (0,) and dtype int64 are invalid: allowed is a non-empty 1-D integer array"),
        (np.zeros(3, dtype=np.int64), np.zeros((3, 0)),
         "probabilities of shape (3, 0) are invalid: allowed is shape (3, M), one row per label"),
        (np.zeros(3, dtype=np.int64), np.eye(3, dtype=np.int64),
         "probabilities of dtype int64 are invalid: allowed are floats in [0, 1] (softmax outputs, not logits)"),
        (np.zeros(3, dtype=np.int64), np.array([[-0.1, 0.6, 0.5]] * 3),
         "probabilities of dtype float64 are invalid: allowed are floats in [0, 1] (softmax outputs, not logits)"),
        (np.zeros(3, dtype=np.int64), np.array([[1.5, 0.0, 0.0]] * 3),
         "probabilities of dtype float64 are invalid: allowed are floats in [0, 1] (softmax outputs, not logits)"),
        (np.array([-1, 0, 1]), _UNIFORM, "label -1 is invalid: allowed are class indices 0..2"),
        (np.array([0, 3, 1]), _UNIFORM, "label 3 is invalid: allowed are class indices 0..2"),
    ],
)
def test_refused_labels_and_probabilities_say_what_is_allowed(
    labels: np.ndarray, probabilities: np.ndarray, message: str
) -> None:
    with pytest.raises(ConfigError, match=_exactly(message)):
        stage2_relabel(labels, probabilities, theta=0.5)


def test_refused_losses_say_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=_exactly("losses of shape (3, 2) are invalid: allowed is shape (n,)")):
        loss_split(np.ones((3, 2)), seed=0)
    with pytest.raises(ConfigError, match=_exactly("losses of dtype <U1 are invalid: allowed are finite real numbers")):
        loss_split(np.array(["a", "b"]), seed=0)
    with pytest.raises(ConfigError,
                       match=_exactly("losses of shape (2,) are invalid: allowed is shape (3,), one per label")):
        stage1_relabel(np.zeros(3, dtype=np.int64), np.ones(2), _UNIFORM, np.ones(3, bool), pi=0.5, theta=0.5)
