import numpy as np

from common.mixture import high_component


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
