"""LID estimation (FedCorr eq. (2)) and the client LID score."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from common.errors import ConfigError
from task import lid
from task.lid import lid_mle, lid_score


def _uniform_in_r10(dim: int, n: int, seed: int) -> np.ndarray:
    """``n`` points uniform in a unit ``dim``-cube, rotated at random into R^10."""
    rng = np.random.default_rng(seed)
    points = np.zeros((n, 10))
    points[:, :dim] = rng.random((n, dim))
    rotation = np.linalg.qr(rng.normal(size=(10, 10)))[0]
    return points @ rotation


def _reference_lid(points: np.ndarray, k: int) -> np.ndarray:
    """Eq. (2) written out point by point, for sets without duplicates."""
    estimates = []
    for i, x in enumerate(points):
        distances = np.sort(np.linalg.norm(np.delete(points, i, axis=0) - x, axis=1))[:k]
        estimates.append(-1.0 / np.mean(np.log(distances / distances[-1])))
    return np.array(estimates)


def _predictions(noisy_share: float, seed: int, n: int = 600, classes: int = 10) -> np.ndarray:
    """Softmax-like vectors near one-hot corners; a share of them pulled towards random other classes.

    Every sample leans a little towards one fixed neighbouring class (a 1-D streak per corner, the kind
    of confusion a model trained on clean labels shows); the "noisy" ones are additionally mixed with a
    random probability vector, so they leave their corner in different directions (FedCorr Sec. 3.1).
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    eye = np.eye(classes)
    lean = rng.uniform(0.0, 0.2, n)[:, None]
    vectors = (1 - lean) * eye[labels] + lean * eye[(labels + 1) % classes]
    pulled = rng.random(n) < noisy_share
    weight = rng.uniform(0.0, 0.6, n)[pulled, None]
    random_vectors = rng.dirichlet(np.ones(classes), pulled.sum())
    vectors[pulled] = (1 - weight) * vectors[pulled] + weight * random_vectors
    return vectors


@pytest.mark.parametrize(("dim", "seed"), [(1, 0), (2, 1), (5, 2)])
def test_score_recovers_the_dimension_of_uniform_data(dim: int, seed: int) -> None:
    # With k = 20 the MLE's mean in the interior is dim * k / (k - 2) (about +11%); points near the
    # boundary pull it down. Measured: 1.11, 2.17, 4.96 for 2000 points.
    score = lid_score(_uniform_in_r10(dim, 2000, seed), k=20)
    assert score == pytest.approx(dim, rel=0.15)


def test_points_with_a_single_coordinate_are_a_valid_set() -> None:
    # Points on a line, given as (n, 1): the estimate is about 1, as for a line inside R^10.
    points = np.random.default_rng(9).random((2000, 1))
    assert lid_score(points, k=20) == pytest.approx(1.0, rel=0.15)


def test_mle_matches_eq2_computed_point_by_point(monkeypatch: pytest.MonkeyPatch) -> None:
    points = np.random.default_rng(3).normal(size=(150, 4))
    # A tiny chunk forces the distance matrix to be built in many row blocks.
    monkeypatch.setattr(lid, "CHUNK_ENTRIES", 1000)
    np.testing.assert_allclose(lid_mle(points, 7), _reference_lid(points, 7), rtol=1e-9)


def test_score_is_invariant_to_translation_and_scale() -> None:
    points = np.random.default_rng(4).random((300, 3))
    assert lid_score(points * 1e-3 + 50.0) == pytest.approx(lid_score(points), rel=1e-6)


def test_estimates_with_duplicates_do_not_depend_on_where_the_set_lies() -> None:
    # With duplicates the distance floor enters eq. (2); the floor follows the set's own radius about
    # its centroid, so moving the set along one axis leaves every estimate as it was.
    points = np.random.default_rng(8).random((100, 4))
    doubled = np.concatenate([points, points])
    moved = doubled + np.array([1000.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(lid_mle(moved, 10), lid_mle(doubled, 10), rtol=1e-9)


def test_diffuse_predictions_score_higher_than_tight_clusters() -> None:
    # The property FedCorr's noisy-client detection rests on (measured: about 1.06, 1.8, 2.05).
    clean, some_noise, more_noise = (lid_score(_predictions(share, seed=5)) for share in (0.0, 0.2, 0.4))
    assert clean < 1.2
    assert clean + 0.4 < some_noise < more_noise


def test_exact_duplicates_count_as_very_close_and_stay_finite() -> None:
    points = np.random.default_rng(6).random((200, 5))
    doubled = np.concatenate([points, points])
    estimates = lid_mle(doubled, 20)
    assert np.isfinite(estimates).all()
    # Each point's duplicate is a neighbour at (almost) zero distance, which drives eq. (2) towards 0.
    assert lid_score(doubled) < 0.5 * lid_score(points)


def test_saturated_predictions_have_lid_zero() -> None:
    # A well-trained model repeats the same one-hot vector: every neighbourhood is a point mass.
    one_hot = np.eye(10, dtype=np.float32)[np.arange(300) % 10]
    np.testing.assert_array_equal(lid_mle(one_hot, 20), 0.0)
    assert lid_score(np.ones((5, 3))) == 0.0


def test_equidistant_neighbours_give_zero_not_infinity() -> None:
    # The corners of a simplex are all equally far apart: eq. (2) would be 1/0.
    np.testing.assert_array_equal(lid_mle(np.eye(4), 3), 0.0)


def test_degenerate_and_duplicate_sets_compute_without_floating_point_warnings() -> None:
    # The 1/0 of a degenerate neighbourhood is never computed, and no deprecated numpy call is made:
    # a client's log stays free of warnings however its predictions look.
    points = np.random.default_rng(6).random((50, 5))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        np.testing.assert_array_equal(lid_mle(np.eye(4), 3), 0.0)
        assert lid_score(np.ones((30, 10))) == 0.0
        assert np.isfinite(lid_mle(np.concatenate([points, points]), 20)).all()


@pytest.mark.parametrize("n", [2, 3, 5])
def test_tiny_sets_use_every_other_point(n: int) -> None:
    # k = 20 is cut to the n - 1 other points; with one neighbour (n = 2) every estimate is 0.
    probabilities = np.random.default_rng(n).dirichlet(np.ones(10), n)
    expected = 0.0 if n == 2 else float(_reference_lid(probabilities, n - 1).mean())
    assert lid_score(probabilities, k=20) == pytest.approx(expected, rel=1e-9)


def test_default_k_is_fedcorrs_20() -> None:
    points = np.random.default_rng(10).random((60, 3))
    assert lid_score(points) == pytest.approx(float(lid_mle(points, 20).mean()), rel=1e-12)
    assert lid_score(points) != pytest.approx(float(lid_mle(points, 21).mean()), rel=1e-6)


def test_one_neighbour_is_allowed_and_always_degenerate() -> None:
    points = np.random.default_rng(11).random((20, 3))
    assert lid_score(points, k=1) == 0.0


def test_k_larger_than_the_set_uses_all_other_points() -> None:
    points = np.random.default_rng(7).random((12, 3))
    assert lid_score(points, k=20) == pytest.approx(float(lid_mle(points, 11).mean()))
    assert lid_score(points, k=20) != pytest.approx(float(lid_mle(points, 5).mean()))


def _exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


# 30.5 is above the 9 other points: cut to min(k, n - 1) = 9 it would pass, so it must be refused first.
@pytest.mark.parametrize("k", [0, -3, 2.5, True, 30.5])
def test_invalid_k_is_rejected(k: object) -> None:
    with pytest.raises(ConfigError, match=_exactly(f"k={k!r} is invalid: allowed is an integer >= 1")):
        lid_score(np.random.default_rng(0).random((10, 3)), k=k)


@pytest.mark.parametrize("k", [0, 2.5, True])
def test_mle_rejects_invalid_k(k: object) -> None:
    with pytest.raises(ConfigError, match=_exactly(f"k={k!r} is invalid: allowed is an integer >= 1")):
        lid_mle(np.random.default_rng(0).random((10, 3)), k)


def test_mle_rejects_k_beyond_the_other_points() -> None:
    with pytest.raises(ConfigError, match=_exactly("k=10 is invalid for 10 points: allowed is an integer <= 9")):
        lid_mle(np.random.default_rng(0).random((10, 3)), 10)


@pytest.mark.parametrize("points", [np.ones((1, 10)), np.ones((0, 10)), np.ones(10)])
def test_fewer_than_two_samples_is_rejected(points: np.ndarray) -> None:
    message = (f"probabilities of shape {points.shape} are invalid: "
               "allowed is (n, M) with n >= 2 (an LID needs at least 2 samples)")
    with pytest.raises(ConfigError, match=_exactly(message)):
        lid_score(points)


@pytest.mark.parametrize("shape", [(1, 3), (0, 3), (10,), (3, 0), (3, 2, 2)])
def test_mle_rejects_sets_that_are_not_two_points_of_a_space(shape: tuple[int, ...]) -> None:
    message = f"points of shape {shape} are invalid: allowed is at least 2 points, shape (n, d)"
    with pytest.raises(ConfigError, match=_exactly(message)):
        lid_mle(np.ones(shape), 1)


def test_non_numeric_points_are_rejected() -> None:
    with pytest.raises(ConfigError, match=_exactly("points of dtype <U1 are invalid: allowed are finite real numbers")):
        lid_mle(np.array([["a", "b"], ["c", "d"]]), 1)


def test_non_finite_points_are_rejected() -> None:
    points = np.random.default_rng(0).random((10, 3))
    points[4, 1] = np.nan
    with pytest.raises(ConfigError, match="finite"):
        lid_mle(points, 3)
