"""Label-noise models. Each returns new noisy labels and leaves its input untouched.

Counts are exact (``round(rate * n)`` samples chosen without replacement), not binomial draws, so
a client asked for 40% noise gets 40% of its samples relabelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import InvalidValue
from common.validation import Flag, Interval, Options
from data.registry import Registry


@dataclass(frozen=True)
class NoisyLabels:
    """labels: the noisy labels (int64, one per sample).
    level: per-client requested noise level (FedCorr's mu_k, FedES's clipped rate, or the global
        eps); the realised rate can be lower when a relabelled sample may keep its true label.
    """

    labels: np.ndarray
    level: np.ndarray


def _relabel(
    labels: np.ndarray, chosen: np.ndarray, num_classes: int, rng: np.random.Generator, how: str
) -> None:
    """Relabel ``labels[chosen]`` in place: 'any' class, 'other' than the current one, or 'next' (y+1 mod M)."""
    current = labels[chosen]
    if how == "any":
        labels[chosen] = rng.integers(num_classes, size=chosen.size)
    elif how == "other":
        labels[chosen] = (current + rng.integers(1, num_classes, size=chosen.size)) % num_classes
    else:
        labels[chosen] = (current + 1) % num_classes


def _pick(members: np.ndarray, rate: float, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(members, size=int(round(rate * members.size)), replace=False)


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
) -> NoisyLabels:
    """FedES's model: client rates ~ N(mean, std) clipped to [0, 1]; symmetric or pair-flip noise."""
    rates = np.clip(rng.normal(mean, std, size=num_clients), 0.0, 1.0)
    how = "other" if kind == "symmetric" else "next"
    return _per_client(true_labels, client, rates, num_classes, rng, how)


def _global(
    true_labels: np.ndarray, num_clients: int, num_classes: int, rng: np.random.Generator, eps: float, how: str
) -> NoisyLabels:
    noisy = true_labels.copy()
    _relabel(noisy, _pick(np.arange(true_labels.size), eps, rng), num_classes, rng, how)
    return NoisyLabels(noisy, np.full(num_clients, float(eps)))


def symmetric(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    eps: float,
) -> NoisyLabels:
    """FedLSR's symmetric flipping: exactly round(eps * n) samples overall move to a different class."""
    return _global(true_labels, num_clients, num_classes, rng, eps, "other")


def pairflip(
    true_labels: np.ndarray,
    client: np.ndarray,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    *,
    eps: float,
) -> NoisyLabels:
    """FedLSR's pair flipping: exactly round(eps * n) samples overall go from y to y+1 mod M."""
    return _global(true_labels, num_clients, num_classes, rng, eps, "next")


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
NOISE_MODELS.add("symmetric", symmetric, {"eps": _RATE})
NOISE_MODELS.add("pairflip", pairflip, {"eps": _RATE})
NOISE_MODELS.add(
    "gaussian", gaussian,
    {"mean": _RATE, "std": Interval(float, 0, finite=True), "kind": Options(("symmetric", "pairflip"))}
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
