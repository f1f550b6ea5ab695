import numpy as np
import pytest

from common.mixture import above_lowest, ashman_d, high_component


def test_flags_the_high_cluster_of_client_scores():
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.normal(10, 1, 40), rng.normal(25, 2, 60)])  # clean, then noisy clients
    flagged = high_component(scores, seed=1)
    assert flagged[:40].sum() == 0 and flagged[40:].all()
    assert np.array_equal(flagged, high_component(scores, seed=1))


def test_no_split_without_two_populations():
    assert not high_component(np.array([3.0]), seed=0).any()
    assert not high_component(np.full(10, 7.5), seed=0).any()
    assert high_component(np.array([]), seed=0).shape == (0,)


def test_the_guards_decline_one_population_and_keep_two():
    rng = np.random.default_rng(3)
    one = rng.normal(20, 2, 100)  # all-clean clients: one population
    two = np.concatenate([rng.normal(10, 1, 40), rng.normal(25, 2, 60)])
    assert high_component(one, seed=1).any(), "the paper's GMM splits one population anyway"
    for guard in ("bic", "separation"):
        assert not high_component(one, seed=1, guard=guard).any(), guard
        assert np.array_equal(high_component(two, seed=1, guard=guard), high_component(two, seed=1)), guard


def test_a_skewed_single_population_is_one_population_to_the_separation_guard():
    # A drifting score (later clients trained on a better model) is skewed, not bimodal: the two
    # components overlap, so Ashman's D stays below 2 even where BIC may prefer two components.
    scores = np.random.default_rng(5).gamma(shape=4.0, scale=2.0, size=100)
    assert high_component(scores, seed=1).any()
    assert not high_component(scores, seed=1, guard="separation").any()


def test_ashman_d_measures_separation_against_spread():
    assert ashman_d(np.array([0.0, 4.0]), np.array([1.0, 1.0])) == pytest.approx(4.0)
    assert ashman_d(np.array([0.0, 1.0]), np.array([1.0, 1.0])) == pytest.approx(1.0)


def test_an_unknown_guard_is_refused():
    with pytest.raises(ValueError, match="guard 'maybe' is unknown: allowed are none, bic, separation"):
        high_component(np.arange(10.0), seed=0, guard="maybe")


def test_above_lowest_picks_the_number_of_components_by_bic_and_flags_all_but_the_lowest():
    rng = np.random.default_rng(2)
    clean, less, more = rng.normal(10, 0.5, 20), rng.normal(20, 0.5, 40), rng.normal(30, 0.5, 40)
    three = np.concatenate([clean, less, more])
    flagged = above_lowest(three, seed=1)
    assert not flagged[:20].any() and flagged[20:].all()
    assert high_component(three, seed=1)[:60].sum() < 40, "two components split the clean with the less noisy"
    two = np.concatenate([clean, more])
    assert np.array_equal(above_lowest(two, seed=1), high_component(two, seed=1))
    one = rng.normal(20, 2, 100)
    assert not above_lowest(one, seed=1).any(), "one population: nobody"
    assert not above_lowest(np.full(5, 3.0), seed=0).any() and above_lowest(np.array([]), seed=0).shape == (0,)
    assert np.array_equal(above_lowest(three, seed=1), above_lowest(three, seed=1))
    assert above_lowest(np.array([1.0, 9.0]), seed=0).tolist() == [False, True], "at most one component per score"
