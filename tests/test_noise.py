from fractions import Fraction

import numpy as np
import pytest
from defaults import noise_params

from common.errors import ConfigError
from data.noise import NOISE_MODELS, SceneLabels, add_noise

M = 10


def scene_arrays(num_clients: int = 200, per_client: int = 300, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(M, size=num_clients * per_client)
    client = np.repeat(np.arange(num_clients), per_client)
    return labels, client


def realised(noisy, labels, client, num_clients) -> np.ndarray:
    return np.bincount(client, weights=noisy != labels, minlength=num_clients) / np.bincount(client)


FEDCORR = {"rho": 0.6, "tau": 0.5, "allow_true_label": True, "label_pool": None}


def test_fedcorr_noisy_client_share_and_levels():
    labels, client = scene_arrays()
    out = add_noise("fedcorr", SceneLabels(labels, client, 200, M), np.random.default_rng(1), FEDCORR)
    noisy_clients = out.level > 0
    assert noisy_clients.mean() == pytest.approx(0.6, abs=0.08)
    assert np.all((out.level[noisy_clients] >= 0.5) & (out.level[noisy_clients] <= 1.0))
    rates = realised(out.labels, labels, client, 200)
    assert np.all(rates[~noisy_clients] == 0)
    # A relabelled sample keeps its true label with probability 1/M (the paper's choice).
    expected = out.level[noisy_clients] * (M - 1) / M
    assert np.abs(rates[noisy_clients] - expected).mean() < 0.03


def test_fedcorr_relabels_an_exact_count_when_the_true_label_is_excluded():
    labels, client = scene_arrays()
    params = {**FEDCORR, "allow_true_label": False}
    out = add_noise("fedcorr", SceneLabels(labels, client, 200, M), np.random.default_rng(1), params)
    counts = np.bincount(client, weights=out.labels != labels, minlength=200)
    assert np.array_equal(counts, np.round(out.level * 300))


def test_fedcorr_codes_label_pool_draws_new_labels_from_the_first_classes_only():
    rng = np.random.default_rng(0)
    labels, client = rng.integers(100, size=200 * 300), np.repeat(np.arange(200), 300)
    pooled = add_noise("fedcorr", SceneLabels(labels, client, 200, 100), np.random.default_rng(1),
                       {**FEDCORR, "label_pool": 10})
    changed = pooled.labels != labels
    # Every changed sample now holds a class below 10; a chosen sample keeps its label only when its
    # class is below 10 and is drawn again (1/10 * 1/10), so on 100 classes the rate is 0.99 mu_k.
    assert set(np.unique(pooled.labels[changed])) == set(range(10))
    noisy = pooled.level > 0
    rates = realised(pooled.labels, labels, client, 200)
    assert np.abs(rates[noisy] - pooled.level[noisy] * (1 - 1 / 10 * 0.1)).mean() < 0.03
    plain = add_noise("fedcorr", SceneLabels(labels, client, 200, 100), np.random.default_rng(1), FEDCORR)
    assert np.array_equal(plain.level, pooled.level) and plain.labels[plain.labels != labels].max() >= 10
    with pytest.raises(ConfigError, match=r"noise.label_pool=101 is invalid: at most the dataset's 100 classes"):
        add_noise("fedcorr", SceneLabels(labels, client, 200, 100), np.random.default_rng(1),
                  {**FEDCORR, "label_pool": 101})
    with pytest.raises(ConfigError, match=r"noise.label_pool=10 is invalid: null with allow_true_label=false"):
        add_noise("fedcorr", SceneLabels(labels, client, 200, 100), np.random.default_rng(1),
                  {**FEDCORR, "label_pool": 10, "allow_true_label": False})


def test_fedcorr_rho_zero_and_one():
    labels, client = scene_arrays(50)
    clean = add_noise("fedcorr", SceneLabels(labels, client, 50, M), np.random.default_rng(0), {**FEDCORR, "rho": 0.0})
    assert np.array_equal(clean.labels, labels) and not clean.level.any()
    full = add_noise("fedcorr", SceneLabels(labels, client, 50, M), np.random.default_rng(0),
                     {**FEDCORR, "rho": 1.0, "tau": 1.0})
    assert np.all(full.level == 1.0)


# FedES's CIFAR-10 asymmetric map, written out here independently of data.noise.
CIFAR10_MAP = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}
FMNIST_MAP = {0: 6, 6: 0, 2: 4, 5: 7, 9: 7}


def uneven_labels(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels whose class sizes differ (7, 13, 25, ...), so floor(eps n_c) per class and round(eps n)
    over the whole set give different counts; 20 clients."""
    sizes = [7, 13, 25, 40, 61, 99, 150, 203, 311, 498]
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(M), sizes))
    return labels, np.arange(labels.size) % 20


def test_the_protocol_noise_defaults_come_from_conf():
    assert noise_params("symmetric") == {"eps": 0.4, "class_balanced": True}
    assert noise_params("pairflip") == {"eps": 0.3, "class_balanced": True, "direction": "down"}
    assert noise_params("gaussian") == {"mean": 0.3, "std": 0.2, "kind": "symmetric", "direction": "up"}


@pytest.mark.parametrize("name", ["symmetric", "pairflip"])
@pytest.mark.parametrize("eps", [0.0, 0.2, 0.3, 0.45, 0.7, 1.0])
def test_protocol_noise_corrupts_exactly_floor_eps_n_c_of_each_class(name, eps):
    labels, client = uneven_labels()
    out = add_noise(name, SceneLabels(labels, client, 20, M), np.random.default_rng(2), noise_params(name, eps=eps))
    changed = out.labels != labels
    sizes = np.bincount(labels, minlength=M)
    expected = [int(Fraction(str(eps)) * int(n)) for n in sizes]  # floor(eps n_c), eps as written
    assert np.bincount(labels[changed], minlength=M).tolist() == expected
    assert np.all(out.level == eps)
    if 0 < eps < 1:
        assert changed.sum() != round(eps * labels.size), "the per-class floors differ from one overall count here"


def test_symmetric_noise_moves_to_a_uniform_other_class():
    labels, client = scene_arrays(20)
    out = add_noise("symmetric", SceneLabels(labels, client, 20, M), np.random.default_rng(2),
                    noise_params("symmetric", eps=0.45))
    changed = out.labels != labels
    offsets = (out.labels[changed] - labels[changed]) % M
    share = np.bincount(offsets, minlength=M)[1:] / changed.sum()
    assert np.allclose(share, 1 / (M - 1), atol=0.02)


@pytest.mark.parametrize("name", ["symmetric", "pairflip"])
def test_protocol_noise_over_the_whole_set_when_not_class_balanced(name):
    labels, client = uneven_labels()
    out = add_noise(name, SceneLabels(labels, client, 20, M), np.random.default_rng(2),
                    noise_params(name, eps=0.45, class_balanced=False))
    assert (out.labels != labels).sum() == round(0.45 * labels.size)


@pytest.mark.parametrize("direction,step", [("down", -1), ("up", 1)])
def test_pairflip_moves_every_flipped_label_one_class_in_its_direction(direction, step):
    labels, client = uneven_labels()
    out = add_noise("pairflip", SceneLabels(labels, client, 20, M), np.random.default_rng(2),
                    noise_params("pairflip", direction=direction))
    changed = out.labels != labels
    assert changed.sum() > 0
    assert np.array_equal(out.labels[changed], (labels[changed] + step) % M)
    assert np.array_equal(out.labels[~changed], labels[~changed])


@pytest.mark.parametrize("name", ["symmetric", "pairflip"])
def test_protocol_noise_is_the_same_for_the_same_seed_only(name):
    labels, client = uneven_labels()
    params = noise_params(name)
    a, b, c = (add_noise(name, SceneLabels(labels, client, 20, M), np.random.default_rng(seed), params)
               for seed in (5, 5, 6))
    assert np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.labels, c.labels)


@pytest.mark.parametrize("kind", ["symmetric", "pairflip"])
def test_gaussian_rates_are_clipped_normal_and_exact(kind):
    labels, client = scene_arrays(400, 100)
    params = noise_params("gaussian", mean=0.3, std=0.4, kind=kind)
    out = add_noise("gaussian", SceneLabels(labels, client, 400, M), np.random.default_rng(3), params)
    assert out.level.min() == 0.0 and out.level.max() <= 1.0
    assert (out.level == 0).mean() == pytest.approx(0.227, abs=0.06)  # P(N(0.3, 0.4) < 0)
    counts = np.bincount(client, weights=out.labels != labels, minlength=400)
    assert np.array_equal(counts, np.round(out.level * 100))
    if kind == "pairflip":
        changed = out.labels != labels
        assert np.array_equal(out.labels[changed], (labels[changed] + 1) % M), "up by default"


def test_gaussian_pairflip_follows_its_direction():
    labels, client = scene_arrays(50, 100)
    params = noise_params("gaussian", kind="pairflip", direction="down")
    out = add_noise("gaussian", SceneLabels(labels, client, 50, M), np.random.default_rng(3), params)
    changed = out.labels != labels
    assert changed.sum() > 0 and np.array_equal(out.labels[changed], (labels[changed] - 1) % M)


@pytest.mark.parametrize("kind,mapping", [("cifar10_asym", CIFAR10_MAP), ("fmnist_asym", FMNIST_MAP)])
def test_a_class_map_flips_every_picked_sample_of_a_mapped_class_to_its_image(kind, mapping):
    labels, client = scene_arrays(50, 200)
    # Every client at rate 1: every sample is picked, so every sample of a mapped class is flipped.
    full = add_noise("gaussian", SceneLabels(labels, client, 50, M), np.random.default_rng(3),
                     noise_params("gaussian", kind=kind, mean=1.0, std=0.0))
    assert full.labels.tolist() == [mapping.get(y, y) for y in labels.tolist()]
    # At rate 0.5 each client's round(0.5 n_k) picks are drawn from all its samples: a picked sample
    # of an unmapped class keeps its label, so about half the mapped samples flip and nothing else.
    half = add_noise("gaussian", SceneLabels(labels, client, 50, M), np.random.default_rng(3),
                     noise_params("gaussian", kind=kind, mean=0.5, std=0.0))
    changed = half.labels != labels
    assert half.labels[changed].tolist() == [mapping[y] for y in labels[changed].tolist()]
    assert not np.isin(labels[changed], [c for c in range(M) if c not in mapping]).any()
    mapped = np.isin(labels, list(mapping))
    per_client = np.bincount(client, weights=changed, minlength=50)
    assert np.all(per_client <= 100) and np.all(per_client <= np.bincount(client, weights=mapped))
    assert changed.sum() / mapped.sum() == pytest.approx(0.5, abs=0.03)
    again = add_noise("gaussian", SceneLabels(labels, client, 50, M), np.random.default_rng(3),
                      noise_params("gaussian", kind=kind, mean=0.5, std=0.0))
    assert np.array_equal(again.labels, half.labels)


@pytest.mark.parametrize("kind", ["cifar10_asym", "fmnist_asym"])
def test_a_class_map_is_refused_for_a_dataset_of_another_class_count(kind):
    labels, client = np.arange(100 * 20) % 100, np.repeat(np.arange(20), 100)
    with pytest.raises(ConfigError, match=rf"^noise.kind='{kind}' is invalid: symmetric or pairflip on this "
                                          r"100-class dataset") as caught:
        add_noise("gaussian", SceneLabels(labels, client, 20, 100), np.random.default_rng(0),
                  noise_params("gaussian", kind=kind))
    assert "\n" not in str(caught.value)


def test_none_and_inputs_are_never_modified():
    labels, client = scene_arrays(10)
    before = labels.copy()
    for name, params in [("none", {}), ("fedcorr", FEDCORR), ("symmetric", noise_params("symmetric", eps=0.5)),
                         ("pairflip", noise_params("pairflip")),
                         ("gaussian", noise_params("gaussian", kind="fmnist_asym"))]:
        out = add_noise(name, SceneLabels(labels, client, 10, M), np.random.default_rng(0), params)
        assert np.array_equal(labels, before)
        assert out.labels is not labels
    clean = add_noise("none", SceneLabels(labels, client, 10, M), np.random.default_rng(0), {})
    assert np.array_equal(clean.labels, labels)


def test_same_seed_same_noise():
    labels, client = scene_arrays(30)
    a = add_noise("fedcorr", SceneLabels(labels, client, 30, M), np.random.default_rng(5), FEDCORR)
    b = add_noise("fedcorr", SceneLabels(labels, client, 30, M), np.random.default_rng(5), FEDCORR)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.level, b.level)


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("fedcorr", {**FEDCORR, "rho": 1.2}, r"noise.rho=1.2 is invalid: allowed is a number >= 0.0 and <= 1.0"),
        ("fedcorr", {**FEDCORR, "rho": -0.1}, r"noise.rho=-0.1"),
        ("fedcorr", {**FEDCORR, "tau": 2}, r"noise.tau=2"),
        ("fedcorr", {**FEDCORR, "rho": True}, r"noise.rho=True"),
        ("fedcorr", {**FEDCORR, "allow_true_label": "yes"}, r"noise.allow_true_label='yes'"),
        ("symmetric", noise_params("symmetric", eps=1.5), r"noise.eps=1.5"),
        ("pairflip", noise_params("pairflip", eps=-1), r"noise.eps=-1"),
        ("gaussian", noise_params("gaussian", std=-0.1), r"noise.std=-0.1"),
        ("gaussian", noise_params("gaussian", kind="diagonal"), r"noise.kind='diagonal' is invalid: allowed are "
                                                                r"symmetric, pairflip, cifar10_asym, fmnist_asym"),
        ("gaussian", noise_params("gaussian", kind="pairflip", direction="left"),
         r"noise.direction='left' is invalid: allowed are down, up"),
        ("pairflip", noise_params("pairflip", direction=1), r"noise.direction=1"),
        ("symmetric", noise_params("symmetric", class_balanced="yes"), r"noise.class_balanced='yes'"),
        ("symmetric", {}, r"needs noise.eps"),
        ("label_swap", {}, r"noise='label_swap' is invalid: allowed are fedcorr, symmetric, pairflip, gaussian, "
                           r"mixed, human, none"),
    ],
)
def test_bad_parameters_fail_with_one_clear_message(name, params, message):
    with pytest.raises(ConfigError, match=message):
        NOISE_MODELS.check(name, params)


# --- mixed: clients with different kinds of noise --------------------------------------------------


def kinds_seen(out, labels, client, num_clients):
    """Per client, how its changed labels moved: 'up' (all to y+1), 'down', 'other' (mixed), or '' (none)."""
    seen = []
    for k in range(num_clients):
        rows = np.flatnonzero((client == k) & (out.labels != labels))
        steps = set(((out.labels[rows] - labels[rows]) % M).tolist())
        seen.append("" if not steps else "up" if steps == {1} else "down" if steps == {M - 1} else "other")
    return seen


def test_mixed_deals_its_noisy_clients_to_the_kinds_in_exact_shares():
    labels, client = scene_arrays(200)
    params = noise_params("mixed", rho=0.6, tau=0.5, symmetric=0.25, pairflip=0.75, direction="down")
    out = add_noise("mixed", SceneLabels(labels, client, 200, M), np.random.default_rng(4), params)
    noisy = np.flatnonzero(out.level > 0)
    assert 0.5 < noisy.size / 200 < 0.7 and np.all((out.level[noisy] >= 0.5) & (out.level[noisy] <= 1))
    seen = kinds_seen(out, labels, client, 200)
    assert all(seen[k] == "" for k in range(200) if k not in noisy), "a clean client keeps its labels"
    assert out.kind == tuple({"other": "symmetric", "down": "pairflip", "": ""}[way] for way in seen)
    counts = {kind: sum(seen[k] == kind for k in noisy) for kind in ("other", "down")}
    quarter = noisy.size / 4
    assert counts["other"] in (int(quarter), int(quarter) + 1) and counts["other"] + counts["down"] == noisy.size
    # Each noisy client relabels exactly round(mu_k n_k) samples; a symmetric one never keeps the label.
    assert np.array_equal(np.rint(realised(out.labels, labels, client, 200) * 300), np.round(out.level * 300))


def test_mixed_kinds_are_dealt_at_random_and_the_same_seed_gives_the_same_scene():
    labels, client = scene_arrays(60)
    params = noise_params("mixed", rho=1.0, symmetric=0.5, pairflip=0.5)
    a, b, c = (add_noise("mixed", SceneLabels(labels, client, 60, M), np.random.default_rng(seed), params)
               for seed in (7, 7, 8))
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.level, b.level)
    first, other = kinds_seen(a, labels, client, 60), kinds_seen(c, labels, client, 60)
    assert first.count("up") == first.count("other") == 30 and first != other
    assert first[:30] != ["up"] * 30 and first[:30] != ["other"] * 30, "kinds are not dealt in client order"


def test_mixed_applies_a_class_map_and_refuses_one_on_a_dataset_of_other_classes():
    labels, client = scene_arrays(40)
    params = noise_params("mixed", rho=1.0, tau=1.0, symmetric=None, pairflip=None, fmnist_asym=1.0)
    out = add_noise("mixed", SceneLabels(labels, client, 40, M), np.random.default_rng(0), params)
    lookup = np.arange(M)
    lookup[[0, 6, 2, 5, 9]] = [6, 0, 4, 7, 7]
    assert np.array_equal(out.labels, lookup[labels]), "at level 1 every sample goes through the map"
    with pytest.raises(ConfigError, match=r"noise.fmnist_asym=1.0 is invalid: null or 0 on this 100-class "
                                          r"dataset: fmnist_asym maps the classes of a 10-class dataset"):
        add_noise("mixed", SceneLabels(labels, client, 40, 100), np.random.default_rng(0), params)


@pytest.mark.parametrize("shares,message", [
    ({"symmetric": 0.5, "pairflip": 0.4}, r"noise.pairflip=0.4 is invalid: allowed is the share that makes the set "
                                          r"shares sum to 1 \(with symmetric 0.5\)"),
    ({"symmetric": None, "pairflip": None}, r"noise.symmetric=None is invalid: allowed is a share in \[0, 1\]: mixed "
                                            r"needs the share of at least one of symmetric, pairflip, cifar10_asym"),
    ({"symmetric": 1.2, "pairflip": None}, r"noise.symmetric=1.2 is invalid: allowed is a number >= 0.0 and <= 1.0"),
])
def test_mixed_shares_must_sum_to_one(shares, message):
    with pytest.raises(ConfigError, match=message):
        NOISE_MODELS.check("mixed", noise_params("mixed", **shares))
    NOISE_MODELS.check("mixed", noise_params("mixed", symmetric=0.7, pairflip=0.1, cifar10_asym=0.2))


# --- human: CIFAR-N's labels -----------------------------------------------------------------------


def test_human_labels_replace_the_chosen_clients_labels_and_their_level_is_the_changed_share():
    labels, client = scene_arrays(40, per_client=50)
    rng = np.random.default_rng(9)
    worst = np.where(rng.random(labels.size) < 0.4, (labels + 3) % M, labels)
    given = SceneLabels(labels, client, 40, M, {"worst": worst})
    every = add_noise("human", given, np.random.default_rng(1), noise_params("human", labels="worst", rho=1.0))
    assert np.array_equal(every.labels, worst)
    assert np.allclose(every.level, realised(worst, labels, client, 40)) and every.level.min() > 0
    some = add_noise("human", given, np.random.default_rng(1), noise_params("human", labels="worst", rho=0.5))
    took = some.level > 0
    assert 10 < took.sum() < 30
    for k in range(40):
        rows = client == k
        assert np.array_equal(some.labels[rows], worst[rows] if took[k] else labels[rows])
    none = add_noise("human", given, np.random.default_rng(1), noise_params("human", labels="worst", rho=0.0))
    assert np.array_equal(none.labels, labels) and not none.level.any()


def test_human_labels_the_scene_did_not_read_are_refused():
    labels, client = scene_arrays(4, per_client=5)
    with pytest.raises(ConfigError, match=r"noise.labels='aggre' is invalid: allowed are worst: the human label sets"):
        add_noise("human", SceneLabels(labels, client, 4, M, {"worst": labels}), np.random.default_rng(0),
                  noise_params("human", labels="aggre"))
