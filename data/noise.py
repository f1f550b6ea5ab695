"""Label-noise models. Each returns new noisy labels and leaves its input untouched.

Counts are exact, not binomial draws. The per-client models (``fedcorr``, ``gaussian``) relabel
exactly round(rate * n_k) of client k's samples, so a client asked for 40% noise gets 40% of its
samples chosen. FedLSR's global models (``symmetric``, ``pairflip``) are class-balanced: exactly
floor(eps * n_c) samples of each true class c, so every class keeps the same share of clean labels
(``class_balanced=false`` draws exactly round(eps * n) over the whole set instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from common.errors import InvalidValue
from common.validation import Flag, Interval, Options
from data.registry import Registry

PAIR_DIRECTIONS = ("down", "up")
"""Where a pair flip sends true class y: ``down`` to y-1 mod M (the FedLSR demo's), ``up`` to y+1 mod M
(Co-teaching's convention)."""

CLASS_MAPS: dict[str, dict[int, int]] = {
    # FedES's CIFAR-10 asymmetric noise: truck -> automobile, bird -> airplane, deer -> horse, cat <-> dog.
    "cifar10_asym": {9: 1, 2: 0, 4: 7, 3: 5, 5: 3},
    # Its Fashion-MNIST analogue (docs/fedes.md): T-shirt/top <-> shirt, pullover -> coat,
    # sandal -> sneaker, ankle boot -> sneaker; trouser, dress, coat, sneaker and bag keep their labels.
    "fmnist_asym": {0: 6, 6: 0, 2: 4, 5: 7, 9: 7},
}
"""Named asymmetric maps (true class -> noisy class) of 10-class datasets; classes not listed are never
flipped."""
CLASS_MAP_CLASSES = 10
GAUSSIAN_KINDS = ("symmetric", "pairflip", *CLASS_MAPS)


@dataclass(frozen=True)
class NoisyLabels:
    """labels: the noisy labels (int64, one per sample).
    level: per-client requested noise level (FedCorr's mu_k, FedES's clipped rate, or the global
        eps); the realised rate can be lower when a chosen sample may keep its true label (FedCorr's
        draw from all classes, a class a class map leaves out).
    """

    labels: np.ndarray
    level: np.ndarray


def _relabel(
    labels: np.ndarray, chosen: np.ndarray, num_classes: int, rng: np.random.Generator, how: str
) -> None:
    """Relabel ``labels[chosen]`` in place: 'any' class, one 'other' than the current one, a pair flip
    'up' (y+1 mod M) or 'down' (y-1 mod M), or through the class map of that name."""
    current = labels[chosen]
    if how == "any":
        labels[chosen] = rng.integers(num_classes, size=chosen.size)
    elif how == "other":
        labels[chosen] = (current + rng.integers(1, num_classes, size=chosen.size)) % num_classes
    elif how in PAIR_DIRECTIONS:
        labels[chosen] = (current + (1 if how == "up" else -1)) % num_classes
    else:
        lookup = np.arange(num_classes)
        lookup[list(CLASS_MAPS[how])] = list(CLASS_MAPS[how].values())
        labels[chosen] = lookup[current]


def _pick(members: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(members, size=int(round(rate * members.size)), replace=False)


def _floor_share(rate: float, count: int) -> int:
    """floor(rate * count) with ``rate`` taken as the decimal it was written as (0.7 * 6000 is 4200,
    whatever the binary float's last bit)."""
    return int(Fraction(str(float(rate))) * count)


def _per_client(
    true_labels: np.ndarray,
    client: np.ndarray,
    rates: np.ndarray,
    num_classes: int,
    rng: np.random.Generator,
    how: str,
) -> NoisyLabels:
    noisy = true_labels.copy()
    for k in np.flatnonzero(rates > 0):
        _relabel(noisy, _pick(np.flatnonzero(client == k), rates[k], rng), num_classes, rng, how)
    return NoisyLabels(noisy, rates)


def fedcorr(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    rho: float,
    tau: float,
    allow_true_label: bool,
    label_pool: int | None = None,
) -> NoisyLabels:
    """FedCorr's model (eq. 4): client k is noisy with probability rho at level mu_k ~ U(tau, 1).

    A noisy client relabels exactly round(mu_k * n_k) of its samples with a class drawn uniformly
    from all M classes, which may be the true one (the paper's choice); with
    ``allow_true_label=False`` the new class always differs. ``label_pool``: draw the new class from
    the first ``label_pool`` classes only (the FedCorr/FedDiv code's hard-coded 10, also on
    CIFAR-100); it may be the true one.
    """
    if label_pool is not None:
        if label_pool > num_classes:
            raise InvalidValue("noise.label_pool", label_pool, f"at most the dataset's {num_classes} classes")
        if not allow_true_label:
            raise InvalidValue("noise.label_pool", label_pool, "null with allow_true_label=false: the code's pool "
                               "draws may give back the true label")
    is_noisy = rng.random(num_clients) < rho
    rates = np.where(is_noisy, rng.uniform(tau, 1.0, size=num_clients), 0.0)
    how = "any" if allow_true_label else "other"
    return _per_client(true_labels, client, rates, label_pool or num_classes, rng, how)


def gaussian(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    mean: float,
    std: float,
    kind: str,
    direction: str,
) -> NoisyLabels:
    """FedES's model: client rates ~ N(mean, std) clipped to [0, 1]. ``kind``: symmetric (a uniformly
    drawn other class), pairflip (to y+1 or y-1 mod M, by ``direction``) or a class map of
    ``CLASS_MAPS``. Client k's rate picks exactly round(rate_k * n_k) of all its samples, as for the
    other kinds; under a class map a picked sample of a class the map leaves out keeps its label (as
    in FedES's released code), so the realised rate is the rate times the client's share of mapped
    classes."""
    if kind in CLASS_MAPS and num_classes != CLASS_MAP_CLASSES:
        raise InvalidValue("noise.kind", kind, f"symmetric or pairflip on this {num_classes}-class dataset: "
                           f"{kind} maps the classes of a {CLASS_MAP_CLASSES}-class dataset")
    rates = np.clip(rng.normal(mean, std, size=num_clients), 0.0, 1.0)
    how = {"symmetric": "other", "pairflip": direction}.get(kind, kind)
    return _per_client(true_labels, client, rates, num_classes, rng, how)


def _global(
    true_labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator, eps: float,
    class_balanced: bool, how: str,
) -> NoisyLabels:
    """FedLSR's global noise (Sec. 4.1: noise injected "evenly ... for each class" before the samples
    are distributed): exactly floor(eps * n_c) of the n_c samples of each true class c, or with
    ``class_balanced=False`` exactly round(eps * n) of all n samples."""
    noisy = true_labels.copy()
    if class_balanced:
        chosen = [rng.choice(members, size=_floor_share(eps, members.size), replace=False)
                  for members in (np.flatnonzero(true_labels == c) for c in range(num_classes))]
        picked = np.concatenate(chosen).astype(np.int64)
    else:
        picked = _pick(np.arange(true_labels.size), eps, rng)
    _relabel(noisy, picked, num_classes, rng, how)
    return NoisyLabels(noisy, np.full(num_clients, float(eps)))


def symmetric(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    eps: float,
    class_balanced: bool,
) -> NoisyLabels:
    """FedLSR's symmetric flipping: the chosen samples (``_global``) move to a uniformly drawn different class."""
    return _global(true_labels, num_clients, num_classes, rng, eps, class_balanced, "other")


def pairflip(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    eps: float,
    class_balanced: bool,
    direction: str,
) -> NoisyLabels:
    """FedLSR's pair flipping: the chosen samples (``_global``) go from y to y-1 mod M (``direction=down``)
    or to y+1 mod M (``up``)."""
    return _global(true_labels, num_clients, num_classes, rng, eps, class_balanced, direction)


def none(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
) -> NoisyLabels:
    """No synthetic noise (clean data, or a dataset such as Clothing1M that ships noisy labels)."""
    return NoisyLabels(true_labels.copy(), np.zeros(num_clients))


# Rates and probabilities are closed intervals, which also refuse NaN and infinities; the spread of
# the gaussian model only needs to be finite (a huge one just pushes every rate to 0 or 1).
_RATE = Interval(float, 0.0, 1.0)
NOISE_MODELS = Registry("noise")
NOISE_MODELS.add("fedcorr", fedcorr, {"rho": _RATE, "tau": _RATE, "allow_true_label": Flag(),
                                      "label_pool": Interval(int, 2, or_none=True)})
_DIRECTION = Options(PAIR_DIRECTIONS)
NOISE_MODELS.add("symmetric", symmetric, {"eps": _RATE, "class_balanced": Flag()})
NOISE_MODELS.add("pairflip", pairflip, {"eps": _RATE, "class_balanced": Flag(), "direction": _DIRECTION})
NOISE_MODELS.add(
    "gaussian", gaussian,
    {"mean": _RATE, "std": Interval(float, 0, finite=True), "kind": Options(GAUSSIAN_KINDS), "direction": _DIRECTION}
)
NOISE_MODELS.add("none", none)


def add_noise(
    name: str,
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    params: Mapping[str, Any],
) -> NoisyLabels:
    """Apply noise model ``name`` to the labels of the training samples; ``client[i]`` owns sample i."""
    return NOISE_MODELS.call(name, true_labels, client, num_clients, num_classes, rng, params=params)
