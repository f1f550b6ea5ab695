"""Label-noise models. Each returns new noisy labels and leaves its input untouched.

Counts are exact, not binomial draws. The per-client models (``fedcorr``, ``gaussian``, ``mixed``)
relabel exactly round(rate * n_k) of client k's samples, so a client asked for 40% noise gets 40% of
its samples chosen. FedLSR's global models (``symmetric``, ``pairflip``) are class-balanced: exactly
floor(eps * n_c) samples of each true class c, so every class keeps the same share of clean labels
(``class_balanced=false`` draws exactly round(eps * n) over the whole set instead). ``human`` gives
chosen clients the labels human annotators gave (CIFAR-N) in place of the dataset's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from common.decimals import as_written
from common.errors import InvalidValue
from common.validation import Flag, Interval, Options
from data.registry import Registry
from data.sources.cifar_n import HUMAN_LABEL_SETS

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
MIXED_KINDS = GAUSSIAN_KINDS
"""The kinds ``mixed`` deals its noisy clients to, each a parameter holding its share."""


@dataclass(frozen=True)
class SceneLabels:
    """What a noise model reads: the scene's training samples, grouped by client.

    shipped: the labels the dataset ships for them (int64); client: who holds each;
    label_sets: other labels the dataset has for the same samples, by name (CIFAR-N's human labels,
        read only for ``human``), each in the same order as ``shipped``.
    """

    shipped: np.ndarray
    client: np.ndarray
    num_clients: int
    num_classes: int
    label_sets: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class NoisyLabels:
    """labels: the noisy labels (int64, one per sample).
    level: per-client requested noise level (FedCorr's mu_k, FedES's clipped rate, the global eps,
        or for human labels the client's share of them that differ); the realised rate can be lower
        when a chosen sample may keep its true label (FedCorr's draw from all classes, a class a class
        map leaves out).
    kind: per-client kind of noise where the model deals several (``mixed``; "" for a clean client),
        else empty.
    """

    labels: np.ndarray
    level: np.ndarray
    kind: tuple[str, ...] = ()


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
    return int(as_written(rate) * count)


def _per_client(
    given: SceneLabels, rates: np.ndarray, num_classes: int, rng: np.random.Generator, how: str | list[str]
) -> NoisyLabels:
    """Relabel exactly round(rates[k] * n_k) of client k's samples, the way ``how`` names (one for
    every client, or one per client)."""
    noisy = given.shipped.copy()
    for k in np.flatnonzero(rates > 0):
        way = how if isinstance(how, str) else how[k]
        _relabel(noisy, _pick(np.flatnonzero(given.client == k), rates[k], rng), num_classes, rng, way)
    return NoisyLabels(noisy, rates)


def _levels(given: SceneLabels, rng: np.random.Generator, rho: float, tau: float) -> np.ndarray:
    """FedCorr's eq. (4): each client is noisy with probability rho, at a level mu_k ~ U(tau, 1)."""
    is_noisy = rng.random(given.num_clients) < rho
    return np.where(is_noisy, rng.uniform(tau, 1.0, size=given.num_clients), 0.0)


def fedcorr(
    given: SceneLabels,
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
        if label_pool > given.num_classes:
            raise InvalidValue("noise.label_pool", label_pool,
                               f"at most the dataset's {given.num_classes} classes")
        if not allow_true_label:
            raise InvalidValue("noise.label_pool", label_pool, "null with allow_true_label=false: the code's pool "
                               "draws may give back the true label")
    rates = _levels(given, rng, rho, tau)
    how = "any" if allow_true_label else "other"
    return _per_client(given, rates, label_pool or given.num_classes, rng, how)


def _fits_class_map(kind: str, num_classes: int) -> bool:
    return kind not in CLASS_MAPS or num_classes == CLASS_MAP_CLASSES


def _map_reason(kind: str) -> str:
    return f"{kind} maps the classes of a {CLASS_MAP_CLASSES}-class dataset"


def _way(kind: str, direction: str) -> str:
    """How ``_relabel`` moves a picked sample of a noise kind: symmetric to another class, pairflip
    by ``direction``, a map by its name."""
    return {"symmetric": "other", "pairflip": direction}.get(kind, kind)


def gaussian(
    given: SceneLabels,
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
    if not _fits_class_map(kind, given.num_classes):
        raise InvalidValue("noise.kind", kind, f"symmetric or pairflip on this {given.num_classes}-class dataset: "
                           f"{_map_reason(kind)}")
    rates = np.clip(rng.normal(mean, std, size=given.num_clients), 0.0, 1.0)
    return _per_client(given, rates, given.num_classes, rng, _way(kind, direction))


def _apportion(shares: list[float], total: int) -> list[int]:
    """``total`` split in proportion to ``shares`` (which sum to 1): each gets the floor of its exact
    part, and what is left goes one each to the largest remainders (the first kind on a tie)."""
    exact = [as_written(share) * total for share in shares]
    counts = [int(part) for part in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: -(exact[i] - counts[i]))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def mixed(
    given: SceneLabels,
    rng: np.random.Generator,
    *,
    rho: float,
    tau: float,
    direction: str,
    **shares: float | None,
) -> NoisyLabels:
    """Clients with different kinds of noise: who is noisy and how much as in FedCorr's eq. (4)
    (probability ``rho``, level mu_k ~ U(``tau``, 1)); the noisy clients are dealt at random to the
    kinds of ``MIXED_KINDS`` whose share is set, in exactly those shares (``_apportion``). A noisy
    client relabels exactly round(mu_k * n_k) of its samples the way its kind does under ``gaussian``."""
    used = {kind: share for kind, share in shares.items() if share is not None}
    for kind, share in used.items():
        if share > 0 and not _fits_class_map(kind, given.num_classes):
            raise InvalidValue(f"noise.{kind}", share, f"null or 0 on this {given.num_classes}-class dataset: "
                               f"{_map_reason(kind)}")
    rates = _levels(given, rng, rho, tau)
    noisy = np.flatnonzero(rates > 0)
    dealt = rng.permutation(np.repeat(list(used), _apportion(list(used.values()), noisy.size)))
    kinds = [""] * given.num_clients
    for k, kind in zip(noisy, dealt):
        kinds[k] = str(kind)
    out = _per_client(given, rates, given.num_classes, rng, [_way(kind, direction) for kind in kinds])
    return replace(out, kind=tuple(kinds))


def _shares_sum_to_one(params: Mapping[str, Any]) -> None:
    """``mixed`` needs a share set for at least one kind, and the set shares must sum to 1."""
    used = {kind: params[kind] for kind in MIXED_KINDS if params.get(kind) is not None}
    if not used:
        raise InvalidValue(f"noise.{MIXED_KINDS[0]}", None, "allowed is a share in [0, 1]: mixed needs the share "
                           f"of at least one of {', '.join(MIXED_KINDS)}")
    if sum(as_written(share) for share in used.values()) != 1:
        *others, last = used
        rest = ", ".join(f"{kind} {used[kind]}" for kind in others) or "no other kind"
        raise InvalidValue(f"noise.{last}", used[last], f"allowed is the share that makes the set shares sum to 1 "
                           f"(with {rest}); set a kind's share to null to leave it out")


def human(
    given: SceneLabels,
    rng: np.random.Generator,
    *,
    labels: str,
    rho: float,
) -> NoisyLabels:
    """Real human label noise (CIFAR-N): each client takes, with probability ``rho``, the labels human
    annotators gave its samples (the label set ``labels``) in place of the dataset's; the others keep
    the dataset's clean labels. A client's level is the share of its labels that changed, so the
    clients with a level > 0 are the noisy ones detection is scored against."""
    if labels not in given.label_sets:
        raise InvalidValue("noise.labels", labels, f"allowed are {', '.join(given.label_sets) or 'none'}: "
                           "the human label sets read for this dataset")
    takes = rng.random(given.num_clients) < rho
    chosen = takes[given.client]
    noisy = np.where(chosen, given.label_sets[labels], given.shipped).astype(np.int64)
    changed = np.bincount(given.client, weights=noisy != given.shipped, minlength=given.num_clients)
    sizes = np.bincount(given.client, minlength=given.num_clients)
    level = np.divide(changed, sizes, out=np.zeros(given.num_clients), where=sizes > 0)
    return NoisyLabels(noisy, level)


def _global(given: SceneLabels, rng: np.random.Generator, eps: float, class_balanced: bool, how: str) -> NoisyLabels:
    """FedLSR's global noise (Sec. 4.1: noise injected "evenly ... for each class" before the samples
    are distributed): exactly floor(eps * n_c) of the n_c samples of each true class c, or with
    ``class_balanced=False`` exactly round(eps * n) of all n samples."""
    noisy = given.shipped.copy()
    if class_balanced:
        chosen = [rng.choice(members, size=_floor_share(eps, members.size), replace=False)
                  for members in (np.flatnonzero(given.shipped == c) for c in range(given.num_classes))]
        picked = np.concatenate(chosen).astype(np.int64)
    else:
        picked = _pick(np.arange(given.shipped.size), eps, rng)
    _relabel(noisy, picked, given.num_classes, rng, how)
    return NoisyLabels(noisy, np.full(given.num_clients, float(eps)))


def symmetric(given: SceneLabels, rng: np.random.Generator, *, eps: float, class_balanced: bool) -> NoisyLabels:
    """FedLSR's symmetric flipping: the chosen samples (``_global``) move to a uniformly drawn different class."""
    return _global(given, rng, eps, class_balanced, "other")


def pairflip(
    given: SceneLabels, rng: np.random.Generator, *, eps: float, class_balanced: bool, direction: str
) -> NoisyLabels:
    """FedLSR's pair flipping: the chosen samples (``_global``) go from y to y-1 mod M (``direction=down``)
    or to y+1 mod M (``up``)."""
    return _global(given, rng, eps, class_balanced, direction)


def none(given: SceneLabels, rng: np.random.Generator) -> NoisyLabels:
    """No synthetic noise (clean data, or a dataset such as Clothing1M that ships noisy labels)."""
    return NoisyLabels(given.shipped.copy(), np.zeros(given.num_clients))


# Rates and probabilities are closed intervals, which also refuse NaN and infinities; the spread of
# the gaussian model only needs to be finite (a huge one just pushes every rate to 0 or 1).
_RATE = Interval(float, 0.0, 1.0)
_SHARE = Interval(float, 0.0, 1.0, or_none=True)
_DIRECTION = Options(PAIR_DIRECTIONS)
NOISE_MODELS = Registry("noise")
NOISE_MODELS.add("fedcorr", fedcorr, {"rho": _RATE, "tau": _RATE, "allow_true_label": Flag(),
                                      "label_pool": Interval(int, 2, or_none=True)})
NOISE_MODELS.add("symmetric", symmetric, {"eps": _RATE, "class_balanced": Flag()})
NOISE_MODELS.add("pairflip", pairflip, {"eps": _RATE, "class_balanced": Flag(), "direction": _DIRECTION})
NOISE_MODELS.add(
    "gaussian", gaussian,
    {"mean": _RATE, "std": Interval(float, 0, finite=True), "kind": Options(GAUSSIAN_KINDS), "direction": _DIRECTION}
)
NOISE_MODELS.add("mixed", mixed, {"rho": _RATE, "tau": _RATE, "direction": _DIRECTION,
                                  **dict.fromkeys(MIXED_KINDS, _SHARE)}, check=_shares_sum_to_one)
NOISE_MODELS.add("human", human, {"labels": Options(HUMAN_LABEL_SETS), "rho": _RATE})
NOISE_MODELS.add("none", none)


def add_noise(name: str, given: SceneLabels, rng: np.random.Generator, params: Mapping[str, Any]) -> NoisyLabels:
    """Apply noise model ``name`` to the training samples ``given`` (their shipped labels, by client)."""
    return NOISE_MODELS.call(name, given, rng, params=params)
