"""FedCorr's two-way splits: a 2-component Gaussian mixture on 1-D scores, high component = noisy.

The server splits clients by cumulative LID (paper Sec. 3.2 step 1); a client splits its samples
by per-sample loss (step 2). Both are the same operation on different scores. The paper always
splits; an optional guard (``GUARDS``) declines when the scores look like one population, which
the paper's GMM cannot say: on all-clean clients it still flags the higher half noisy.
"""

from __future__ import annotations

import numpy as np

# Scores whose spread is below this share of their magnitude are one population.
SPREAD_TOLERANCE = 1e-6
# none: always split (the paper). bic: split only when two components have the lower Bayesian
# information criterion. separation: split only when Ashman's D of the two components reaches
# MIN_SEPARATION (D = sqrt(2) |m1 - m2| / sqrt(s1^2 + s2^2); D > 2 is the usual mark of a clean
# separation between two Gaussians).
GUARDS = ("none", "bic", "separation")
MIN_SEPARATION = 2.0
# The most components ``above_lowest`` compares: clean, less noisy and noisier clients.
MAX_COMPONENTS = 3


def ashman_d(means: np.ndarray, variances: np.ndarray) -> float:
    """Ashman's D of two 1-D Gaussian components: their distance against their pooled spread."""
    means, variances = np.ravel(means), np.ravel(variances)
    return float(np.sqrt(2.0) * abs(means[0] - means[1]) / np.sqrt(variances[0] + variances[1]))


def _one_population(values: np.ndarray) -> bool:
    return values.shape[0] < 2 or np.ptp(values) <= SPREAD_TOLERANCE * max(1.0, float(np.abs(values).max()))


def high_component(scores: np.ndarray, seed: int, guard: str = "none") -> np.ndarray:
    """Boolean mask of the scores assigned to the component with the larger mean.

    Fewer than two scores, or scores that are all (nearly) the same, carry no split: nobody is
    flagged; so does a ``guard`` that finds one population. ``seed`` is scikit-learn's
    ``random_state``, so the split is reproducible.
    """
    if guard not in GUARDS:
        raise ValueError(f"guard {guard!r} is unknown: allowed are {', '.join(GUARDS)}")
    values = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    nobody = np.zeros(values.shape[0], dtype=bool)
    if _one_population(values):
        return nobody
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    mixture = GaussianMixture(n_components=2, random_state=seed).fit(values)
    if guard == "bic":
        one = GaussianMixture(n_components=1, random_state=seed).fit(values)
        if one.bic(values) <= mixture.bic(values):
            return nobody
    if guard == "separation" and ashman_d(mixture.means_, mixture.covariances_) < MIN_SEPARATION:
        return nobody
    return mixture.predict(values) == int(np.argmax(mixture.means_.ravel()))


def above_lowest(scores: np.ndarray, seed: int, max_components: int = MAX_COMPONENTS) -> np.ndarray:
    """Boolean mask of the scores outside the lowest-mean component of the Gaussian mixture of 1 to
    ``max_components`` components (at most one per score) with the lowest Bayesian information
    criterion: with one component nobody, with two the higher one, with three the two higher ones.

    Where the paper's two components may split the noisy clients among themselves (most clients
    noisy, at spread levels), a third component can take the noisier ones and leave the split
    between the clean and the rest. Scores that carry no split flag nobody, as in ``high_component``.
    """
    values = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    if _one_population(values):
        return np.zeros(values.shape[0], dtype=bool)
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    fits = [GaussianMixture(n_components=k, random_state=seed).fit(values)
            for k in range(1, min(max_components, values.shape[0]) + 1)]
    best = min(fits, key=lambda mixture: mixture.bic(values))
    return best.predict(values) != int(np.argmin(best.means_.ravel()))
