"""Federated partitioners: split a training set's indices among clients.

Every partitioner returns one sorted int64 index array per client; together they are disjoint and
cover every sample exactly once. Parameters are checked by ``PARTITIONERS.check`` before any work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.errors import ConfigError, InvalidValue
from common.validation import Interval
from data.registry import Registry

Partition = list[np.ndarray]

# How many times `dirichlet` redraws before it declares alpha too small for the client count.
_DIRICHLET_MAX_DRAWS = 1000
# `fedcorr_noniid` redraws a client's class row until it owns a class; p must make that take at most
# this many draws on average, or a tiny p (1e-300) would loop for ever.
_ROW_MAX_EXPECTED_DRAWS = 1000
# Beyond this concentration Dirichlet shares equal 1/N to 0.1% (use `iid`), and near 1e307 numpy's
# gamma draws overflow and return all-zero shares, which would silently give wrong partitions.
_MAX_ALPHA = 1e6


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> Partition:
    """Shuffle and deal out equal shares; the first ``n mod N`` clients get one sample more."""
    order = rng.permutation(labels.shape[0])
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def fedcorr_noniid(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, p: float, alpha: float
) -> Partition:
    """FedCorr's non-IID partition (Sec. 3.1): Bernoulli(p) class ownership x Dirichlet(alpha) shares.

    Each entry of the N x M indicator matrix is Bernoulli(p). A client that owns no class has its
    row redrawn (rows are independent, so this samples exactly the row distribution conditioned on
    being non-empty). A class owned by nobody is given to one client chosen uniformly, so every
    sample has an owner. Within class j, each of its v_j owners first receives one sample and the
    remaining n_j - v_j samples go to the owners by a multinomial draw with probabilities
    q_j ~ Dir(alpha): every (client, owned class) pair is non-empty, hence no client is empty.
    """
    num_classes = int(labels.max()) + 1
    _check_row_draws(p, num_classes)
    owners = rng.random((num_clients, num_classes)) < p
    for client in range(num_clients):
        while not owners[client].any():
            owners[client] = rng.random(num_classes) < p
    for unowned in np.flatnonzero(~owners.any(axis=0)):
        owners[rng.integers(num_clients), unowned] = True

    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == cls))
        holders = np.flatnonzero(owners[:, cls])
        if members.size < holders.size:
            raise ConfigError(
                f"partition=fedcorr_noniid: class {cls} has {members.size} samples but "
                f"{holders.size} clients own it, so some client would get none of it; "
                "use fewer clients or a smaller partition.p"
            )
        shares = rng.dirichlet(np.full(holders.size, alpha))
        counts = 1 + rng.multinomial(members.size - holders.size, shares)
        for holder, chunk in zip(holders, np.split(members, np.cumsum(counts)[:-1])):
            parts[holder].append(chunk)
    return [np.sort(np.concatenate(chunks)) for chunks in parts]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    min_size: int,
) -> Partition:
    """Per-class Dirichlet(alpha) shares over all clients (Hsu et al. 2019).

    The whole draw is repeated until every client holds at least ``min_size`` samples; a setting
    that cannot reach it within a bounded number of draws is reported as a configuration error.
    """
    if num_clients * min_size > labels.shape[0]:
        raise ConfigError(
            f"partition.min_size={min_size} is invalid: allowed is at most {labels.shape[0] // num_clients}: "
            f"{num_clients} clients x {min_size} = {num_clients * min_size} samples exceeds the "
            f"{labels.shape[0]} training samples"
        )
    num_classes = int(labels.max()) + 1
    by_class = [np.flatnonzero(labels == cls) for cls in range(num_classes)]
    for _ in range(_DIRICHLET_MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in by_class:
            members = rng.permutation(members)
            counts = rng.multinomial(members.size, rng.dirichlet(np.full(num_clients, alpha)))
            for client, chunk in enumerate(np.split(members, np.cumsum(counts)[:-1])):
                parts[client].append(chunk)
        sizes = [sum(chunk.size for chunk in chunks) for chunks in parts]
        if min(sizes) >= min_size:
            return [np.sort(np.concatenate(chunks)) for chunks in parts]
    raise ConfigError(
        f"partition=dirichlet: no draw in {_DIRICHLET_MAX_DRAWS} gave every one of {num_clients} "
        f"clients at least partition.min_size={min_size} samples with partition.alpha={alpha}; "
        "raise alpha, lower min_size or use fewer clients"
    )


def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, shards_per_client: int
) -> Partition:
    """McMahan et al.'s shards: sort by label, cut into N*k equal shards, deal k at random to each client."""
    num_shards = num_clients * shards_per_client
    if num_shards > labels.shape[0]:
        raise ConfigError(
            f"partition.shards_per_client={shards_per_client} is invalid: allowed is at most "
            f"{labels.shape[0] // num_clients}: {num_clients} clients x {shards_per_client} = {num_shards} shards "
            f"exceeds the {labels.shape[0]} training samples"
        )
    # A random permutation before the stable sort shuffles samples within each class.
    shuffled = rng.permutation(labels.shape[0])
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    pieces = np.array_split(by_label, num_shards)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def _check_row_draws(p: float, num_classes: int) -> None:
    """``p`` must be at least 1 / (_ROW_MAX_EXPECTED_DRAWS * M).

    A row of M Bernoulli(p) entries owns a class with probability 1 - (1 - p)^M, about p M for a
    small p, so at this bound a client's row takes about _ROW_MAX_EXPECTED_DRAWS draws.
    """
    smallest = 1 / (_ROW_MAX_EXPECTED_DRAWS * num_classes)
    if p < smallest:
        raise InvalidValue(
            "partition.p", p,
            f"allowed with {num_classes} classes is a number >= {smallest} and <= 1.0 "
            "(a smaller p leaves a client owning no class in nearly every draw)",
        )


_ALPHA = Interval(float, 0.0, _MAX_ALPHA, closed="right")
PARTITIONERS = Registry("partition")
PARTITIONERS.add("iid", iid)
PARTITIONERS.add("fedcorr_noniid", fedcorr_noniid, {"p": Interval(float, 0.0, 1.0, closed="right"), "alpha": _ALPHA})
PARTITIONERS.add("dirichlet", dirichlet, {"alpha": _ALPHA, "min_size": Interval(int, 1)})
PARTITIONERS.add("shards", shards, {"shards_per_client": Interval(int, 1)})


def partition(
    name: str,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    params: Mapping[str, Any],
) -> Partition:
    """Split sample indices 0..len(labels)-1 among ``num_clients`` clients with partitioner ``name``."""
    PARTITIONERS.check(name, params)
    if num_clients > labels.shape[0]:
        raise ConfigError(
            f"num_clients={num_clients} is invalid: allowed is at most the {labels.shape[0]} training "
            "samples: every client needs at least one sample"
        )
    return PARTITIONERS.call(name, labels, num_clients, rng, params=params)
