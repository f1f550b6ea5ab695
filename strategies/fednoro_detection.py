"""FedNoRo's noisy-client detection (``docs/fednoro.md``): a 2-component Gaussian
mixture on the clients' per-class loss vectors of the warmed-up global model, voted over several fits.

Each client reports, per class of its given labels, the global model's mean cross-entropy (and
whether it has the class). A class a client lacks counts as clean: its entry becomes the column's
minimum. Each class column is min-max normalised across clients, so every class weighs the same;
the mixture's component whose mean vector has the larger sum is the noisy one. The split is fitted
``runs`` times with different seeds and the most frequent split wins.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def normalised_class_losses(losses: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The N x C matrix the mixture is fitted on: a missing entry (``present`` 0: a 0/1 mask, or
    counts) is its column's minimum over the clients that have the class, then every column is
    min-max normalised (a constant column, or one no client has, is 0)."""
    losses = np.asarray(losses, dtype=np.float64)
    present = np.asarray(present) > 0
    matrix = np.zeros_like(losses)
    for c in range(losses.shape[1]):
        column = losses[present[:, c], c]
        if column.size == 0:
            continue
        low, high = column.min(), column.max()
        filled = np.where(present[:, c], losses[:, c], low)
        matrix[:, c] = (filled - low) / (high - low) if high > low else 0.0
    return matrix


def noisy_split(matrix: np.ndarray, seed: int) -> tuple[int, ...]:
    """The rows a full-covariance 2-component mixture puts in its larger-sum component (sklearn's
    defaults otherwise: k-means initialisation, reg_covar 1e-6, tol 1e-3, 100 iterations)."""
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    mixture = GaussianMixture(n_components=2, covariance_type="full", random_state=seed).fit(matrix)
    noisy = int(np.argmax(mixture.means_.sum(axis=1)))
    return tuple(int(row) for row in np.flatnonzero(mixture.predict(matrix) == noisy))


def voted_noisy_rows(matrix: np.ndarray, seeds: list[int]) -> tuple[tuple[int, ...], float]:
    """The most frequent split over one fit per seed (exact set equality; a tie goes to the split
    seen first) and the share of fits that agree with it. Fewer than two distinct rows carry no
    split: nobody is noisy."""
    if matrix.shape[0] < 2 or len(np.unique(matrix, axis=0)) < 2:
        return (), 1.0
    splits = [noisy_split(matrix, seed) for seed in seeds]
    counts = Counter(splits)
    best = max(counts.values())
    winner = next(split for split in splits if counts[split] == best)
    return winner, best / len(splits)
