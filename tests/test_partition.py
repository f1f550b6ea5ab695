import numpy as np
import pytest

from common.errors import ConfigError
from data.partition import PARTITIONERS, partition

NUM_CLASSES = 10


def make_labels(n: int = 6000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % NUM_CLASSES)


def owned_classes(parts, labels) -> np.ndarray:
    return np.array([np.unique(labels[p]).size for p in parts])


def assert_disjoint_and_complete(parts, n: int) -> None:
    flat = np.concatenate(parts)
    assert flat.size == n, "every sample is assigned exactly once"
    assert np.array_equal(np.sort(flat), np.arange(n))
    assert all(np.all(np.diff(p) > 0) for p in parts), "each client's indices are sorted and unique"


PARAMS = {
    "iid": {},
    "fedcorr_noniid": {"p": 0.7, "alpha": 10.0},
    "dirichlet": {"alpha": 0.5, "min_size": 10},
    "shards": {"shards_per_client": 2},
}


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("n,num_clients", [(6000, 100), (1003, 7)])
def test_every_partitioner_is_disjoint_complete_and_nonempty(name, n, num_clients):
    labels = make_labels(n)
    parts = partition(name, labels, num_clients, np.random.default_rng(1), PARAMS[name])
    assert len(parts) == num_clients
    assert_disjoint_and_complete(parts, n)
    assert min(p.size for p in parts) >= 1


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_same_seed_same_partition_other_seed_differs(name):
    labels = make_labels()
    first = partition(name, labels, 50, np.random.default_rng(3), PARAMS[name])
    again = partition(name, labels, 50, np.random.default_rng(3), PARAMS[name])
    other = partition(name, labels, 50, np.random.default_rng(4), PARAMS[name])
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_iid_sizes_are_equal_up_to_the_remainder():
    parts = partition("iid", make_labels(1003), 10, np.random.default_rng(0), {})
    sizes = sorted(p.size for p in parts)
    assert sizes == [100] * 7 + [101] * 3


def test_fedcorr_noniid_classes_per_client_follow_p():
    labels = make_labels(20000)
    means = {}
    for p in (0.3, 0.5, 0.9):
        parts = partition("fedcorr_noniid", labels, 200, np.random.default_rng(0), {"p": p, "alpha": 10.0})
        means[p] = owned_classes(parts, labels).mean()
    assert means[0.3] < means[0.5] < means[0.9]
    # E[#classes | row non-empty] = M p / (1 - (1-p)^M) = 5.005 for p = 0.5, M = 10.
    assert means[0.5] == pytest.approx(5.005, abs=0.35)


def test_fedcorr_noniid_sizes_even_out_as_alpha_grows():
    labels = make_labels(20000)

    def size_spread(alpha: float) -> float:
        parts = partition("fedcorr_noniid", labels, 100, np.random.default_rng(0), {"p": 0.7, "alpha": alpha})
        sizes = np.array([p.size for p in parts])
        return sizes.std() / sizes.mean()

    assert size_spread(0.1) > size_spread(1.0) > size_spread(100.0)


def test_fedcorr_noniid_owns_every_class_even_with_tiny_p():
    labels = make_labels(600)
    for seed in range(20):
        parts = partition("fedcorr_noniid", labels, 3, np.random.default_rng(seed), {"p": 0.05, "alpha": 1.0})
        assert_disjoint_and_complete(parts, labels.size)
        assert min(p.size for p in parts) >= 1


def test_fedcorr_noniid_rejects_more_owners_than_class_samples():
    labels = np.repeat(np.arange(NUM_CLASSES), 3)
    with pytest.raises(ConfigError, match="class .* has 3 samples but .* clients own it"):
        partition("fedcorr_noniid", labels, 25, np.random.default_rng(0), {"p": 1.0, "alpha": 1.0})


def test_dirichlet_skew_grows_as_alpha_shrinks_and_min_size_holds():
    labels = make_labels(20000)

    def top_class_share(alpha: float) -> float:
        parts = partition("dirichlet", labels, 50, np.random.default_rng(0), {"alpha": alpha, "min_size": 20})
        assert min(p.size for p in parts) >= 20
        return float(np.mean([np.bincount(labels[p], minlength=NUM_CLASSES).max() / p.size for p in parts]))

    assert top_class_share(0.1) > top_class_share(1.0) > top_class_share(100.0)
    assert top_class_share(100.0) < 0.2


def test_dirichlet_reports_an_unreachable_min_size():
    with pytest.raises(ConfigError, match="min_size=500"):
        partition("dirichlet", make_labels(1000), 10, np.random.default_rng(0), {"alpha": 0.5, "min_size": 500})


def test_shards_give_few_classes_and_equal_sizes():
    labels = make_labels(6000)
    parts = partition("shards", labels, 100, np.random.default_rng(0), {"shards_per_client": 2})
    assert {p.size for p in parts} == {60}
    # Two label-sorted shards cover at most two classes unless a shard straddles a class boundary.
    assert owned_classes(parts, labels).max() <= 4
    assert owned_classes(parts, labels).mean() < 2.2


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("fedcorr_noniid", {"p": 0.0, "alpha": 1.0},
         r"partition.p=0.0 is invalid: allowed is a number > 0.0 and <= 1.0"),
        ("fedcorr_noniid", {"p": 1.5, "alpha": 1.0}, r"partition.p=1.5"),
        ("fedcorr_noniid", {"p": 0.5, "alpha": 0}, r"partition.alpha=0 is invalid"),
        ("dirichlet", {"alpha": -1.0, "min_size": 1}, r"partition.alpha=-1.0"),
        ("dirichlet", {"alpha": 1.0, "min_size": 0}, r"partition.min_size=0 .* integer >= 1"),
        ("shards", {"shards_per_client": "two"}, r"partition.shards_per_client='two'"),
        ("fedcorr_noniid", {"p": 0.5}, r"needs partition.alpha"),
        ("bogus", {}, r"partition='bogus' is invalid: allowed are iid, fedcorr_noniid, dirichlet, shards"),
    ],
)
def test_bad_parameters_fail_with_one_clear_message(name, params, message):
    with pytest.raises(ConfigError, match=message):
        PARTITIONERS.check(name, params)


def test_more_clients_than_samples_is_rejected():
    with pytest.raises(ConfigError, match="num_clients=11 is invalid: allowed is at most the 10 training samples"):
        partition("iid", make_labels(10), 11, np.random.default_rng(0), {})


def test_too_many_shards_is_rejected():
    with pytest.raises(ConfigError, match="shards exceeds"):
        partition("shards", make_labels(100), 60, np.random.default_rng(0), {"shards_per_client": 2})
