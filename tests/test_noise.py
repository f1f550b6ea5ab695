import numpy as np
import pytest

from common.errors import ConfigError
from data.noise import NOISE_MODELS, add_noise

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
    out = add_noise("fedcorr", labels, client, 200, M, np.random.default_rng(1), FEDCORR)
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
    out = add_noise("fedcorr", labels, client, 200, M, np.random.default_rng(1), params)
    counts = np.bincount(client, weights=out.labels != labels, minlength=200)
    assert np.array_equal(counts, np.round(out.level * 300))


def test_fedcorr_codes_label_pool_draws_new_labels_from_the_first_classes_only():
    rng = np.random.default_rng(0)
    labels, client = rng.integers(100, size=200 * 300), np.repeat(np.arange(200), 300)
    pooled = add_noise("fedcorr", labels, client, 200, 100, np.random.default_rng(1), {**FEDCORR, "label_pool": 10})
    changed = pooled.labels != labels
    # Every changed sample now holds a class below 10; a chosen sample keeps its label only when its
    # class is below 10 and is drawn again (1/10 * 1/10), so on 100 classes the rate is 0.99 mu_k.
    assert set(np.unique(pooled.labels[changed])) == set(range(10))
    noisy = pooled.level > 0
    rates = realised(pooled.labels, labels, client, 200)
    assert np.abs(rates[noisy] - pooled.level[noisy] * (1 - 1 / 10 * 0.1)).mean() < 0.03
    plain = add_noise("fedcorr", labels, client, 200, 100, np.random.default_rng(1), FEDCORR)
    assert np.array_equal(plain.level, pooled.level) and plain.labels[plain.labels != labels].max() >= 10
    with pytest.raises(ConfigError, match=r"noise.label_pool=101 is invalid: at most the dataset's 100 classes"):
        add_noise("fedcorr", labels, client, 200, 100, np.random.default_rng(1), {**FEDCORR, "label_pool": 101})
    with pytest.raises(ConfigError, match=r"noise.label_pool=10 is invalid: null with allow_true_label=false"):
        add_noise("fedcorr", labels, client, 200, 100, np.random.default_rng(1),
                  {**FEDCORR, "label_pool": 10, "allow_true_label": False})


def test_fedcorr_rho_zero_and_one():
    labels, client = scene_arrays(50)
    clean = add_noise("fedcorr", labels, client, 50, M, np.random.default_rng(0), {**FEDCORR, "rho": 0.0})
    assert np.array_equal(clean.labels, labels) and not clean.level.any()
    full = add_noise("fedcorr", labels, client, 50, M, np.random.default_rng(0), {**FEDCORR, "rho": 1.0, "tau": 1.0})
    assert np.all(full.level == 1.0)


@pytest.mark.parametrize("eps", [0.0, 0.2, 0.45, 1.0])
def test_symmetric_flips_exactly_eps_to_other_classes(eps):
    labels, client = scene_arrays(20)
    out = add_noise("symmetric", labels, client, 20, M, np.random.default_rng(2), {"eps": eps})
    changed = out.labels != labels
    assert changed.sum() == round(eps * labels.size)
    if eps == 0.45:
        # The new class is uniform over the M-1 others.
        offsets = (out.labels[changed] - labels[changed]) % M
        share = np.bincount(offsets, minlength=M)[1:] / changed.sum()
        assert np.allclose(share, 1 / (M - 1), atol=0.02)


def test_pairflip_moves_to_the_next_class():
    labels, client = scene_arrays(20)
    out = add_noise("pairflip", labels, client, 20, M, np.random.default_rng(2), {"eps": 0.3})
    changed = out.labels != labels
    assert changed.sum() == round(0.3 * labels.size)
    assert np.array_equal(out.labels[changed], (labels[changed] + 1) % M)


@pytest.mark.parametrize("kind", ["symmetric", "pairflip"])
def test_gaussian_rates_are_clipped_normal_and_exact(kind):
    labels, client = scene_arrays(400, 100)
    params = {"mean": 0.3, "std": 0.4, "kind": kind}
    out = add_noise("gaussian", labels, client, 400, M, np.random.default_rng(3), params)
    assert out.level.min() == 0.0 and out.level.max() <= 1.0
    assert (out.level == 0).mean() == pytest.approx(0.227, abs=0.06)  # P(N(0.3, 0.4) < 0)
    counts = np.bincount(client, weights=out.labels != labels, minlength=400)
    assert np.array_equal(counts, np.round(out.level * 100))
    if kind == "pairflip":
        changed = out.labels != labels
        assert np.array_equal(out.labels[changed], (labels[changed] + 1) % M)


def test_none_and_inputs_are_never_modified():
    labels, client = scene_arrays(10)
    before = labels.copy()
    for name, params in [("none", {}), ("fedcorr", FEDCORR), ("symmetric", {"eps": 0.5})]:
        out = add_noise(name, labels, client, 10, M, np.random.default_rng(0), params)
        assert np.array_equal(labels, before)
        assert out.labels is not labels
    assert np.array_equal(add_noise("none", labels, client, 10, M, np.random.default_rng(0), {}).labels, labels)


def test_same_seed_same_noise():
    labels, client = scene_arrays(30)
    a = add_noise("fedcorr", labels, client, 30, M, np.random.default_rng(5), FEDCORR)
    b = add_noise("fedcorr", labels, client, 30, M, np.random.default_rng(5), FEDCORR)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.level, b.level)


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("fedcorr", {**FEDCORR, "rho": 1.2}, r"noise.rho=1.2 is invalid: allowed is a number >= 0.0 and <= 1.0"),
        ("fedcorr", {**FEDCORR, "rho": -0.1}, r"noise.rho=-0.1"),
        ("fedcorr", {**FEDCORR, "tau": 2}, r"noise.tau=2"),
        ("fedcorr", {**FEDCORR, "rho": True}, r"noise.rho=True"),
        ("fedcorr", {**FEDCORR, "allow_true_label": "yes"}, r"noise.allow_true_label='yes'"),
        ("symmetric", {"eps": 1.5}, r"noise.eps=1.5"),
        ("pairflip", {"eps": -1}, r"noise.eps=-1"),
        ("gaussian", {"mean": 0.3, "std": -0.1, "kind": "symmetric"}, r"noise.std=-0.1"),
        ("gaussian", {"mean": 0.3, "std": 0.1, "kind": "diagonal"}, r"noise.kind='diagonal'"),
        ("symmetric", {}, r"needs noise.eps"),
        ("label_swap", {}, r"noise='label_swap' is invalid: allowed are fedcorr, symmetric, pairflip, gaussian, none"),
    ],
)
def test_bad_parameters_fail_with_one_clear_message(name, params, message):
    with pytest.raises(ConfigError, match=message):
        NOISE_MODELS.check(name, params)
