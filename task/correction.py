"""FedCorr's client-side label correction: the per-sample-loss GMM split and the two relabelling steps.

Stage 1 (Sec. 3.2 steps 2-3, eqs. (6)-(7)) relabels the largest-loss part of the noisy subset; stage 2
(Sec. 3.3) relabels every confidently predicted sample of a remaining noisy client. Both relabel with
the global model's argmax and only where its max probability reaches the confidence threshold theta.
"""

from __future__ import annotations

import math

import numpy as np

from common.errors import ConfigError
from common.mixture import high_component
from common.validation import Interval


def _check_losses(losses: np.ndarray, n: int | None = None) -> np.ndarray:
    array = np.asarray(losses)
    if array.ndim != 1 or (n is not None and array.shape[0] != n):
        expected = "(n,)" if n is None else f"({n},), one per label"
        raise ConfigError(f"losses of shape {array.shape} are invalid: allowed is shape {expected}")
    if not np.issubdtype(array.dtype, np.number) or not np.isfinite(array).all():
        raise ConfigError(f"losses of dtype {array.dtype} are invalid: allowed are finite real numbers")
    return array.astype(np.float64)


def _check_labels(labels: np.ndarray, probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate labels (n,) and probabilities (n, M) against each other; return them as arrays."""
    labels = np.asarray(labels)
    probabilities = np.asarray(probabilities)
    if labels.ndim != 1 or labels.shape[0] < 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"labels of shape {labels.shape} and dtype {labels.dtype} are invalid: "
            "allowed is a non-empty 1-D integer array"
        )
    n = labels.shape[0]
    if probabilities.ndim != 2 or probabilities.shape[0] != n or probabilities.shape[1] < 1:
        raise ConfigError(
            f"probabilities of shape {probabilities.shape} are invalid: allowed is shape ({n}, M), "
            "one row per label"
        )
    if not np.issubdtype(probabilities.dtype, np.floating) or not (
        np.isfinite(probabilities).all() and probabilities.min() >= 0.0 and probabilities.max() <= 1.0
    ):
        raise ConfigError(
            f"probabilities of dtype {probabilities.dtype} are invalid: allowed are floats in [0, 1] "
            "(softmax outputs, not logits)"
        )
    classes = probabilities.shape[1]
    if labels.min() < 0 or labels.max() >= classes:
        bad = int(labels.min()) if labels.min() < 0 else int(labels.max())
        raise ConfigError(f"label {bad} is invalid: allowed are class indices 0..{classes - 1}")
    return labels, probabilities


def _check_mask(mask: np.ndarray, n: int, name: str) -> np.ndarray:
    """``mask`` as an array after checking it is one boolean per label."""
    array = np.asarray(mask)
    if array.shape != (n,) or array.dtype != np.bool_:
        raise ConfigError(f"{name} mask of shape {array.shape} and dtype {array.dtype} is invalid: "
                          f"allowed is a boolean array of shape ({n},)")
    return array


def _relabel(
    labels: np.ndarray, probabilities: np.ndarray, rows: np.ndarray, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Set ``rows`` whose max probability is >= theta to the argmax (eq. (7)).

    Returns (a relabelled copy, ascending indices whose label changed).
    """
    confident = rows[probabilities[rows].max(axis=1) >= theta]
    new_labels = labels.copy()
    new_labels[confident] = probabilities[confident].argmax(axis=1)
    return new_labels, np.flatnonzero(new_labels != labels)


def loss_split(losses: np.ndarray, seed: int) -> np.ndarray:
    """Boolean mask of the noisy subset D_n (Sec. 3.2 step 2).

    A 2-component scikit-learn GaussianMixture (random_state=seed) is fit on the per-sample losses;
    samples assigned to the component with the larger mean are noisy. Fewer than 2 samples, or losses
    that are (near-)identical, give nobody noisy: there is no second population to find.
    """
    return high_component(_check_losses(losses), seed)


def stage1_relabel(
    labels: np.ndarray,
    losses: np.ndarray,
    probabilities: np.ndarray,
    noisy: np.ndarray,
    *,
    pi: float,
    theta: float,
) -> tuple[np.ndarray, float, np.ndarray]:
    """Stage-1 correction of a noisy client, FedCorr eqs. (6)-(7).

    mu_hat = |D_n| / n; the floor(pi * |D_n|) samples of D_n with the largest losses (ties: lower index
    first) are relabelled to the argmax of the global model's prediction where its max probability is
    >= theta. Returns (new labels, a copy; mu_hat; ascending indices whose label changed). A sample whose
    argmax already equals its label is not counted as changed. Inputs are not modified.
    """
    Interval(float, 0.0, 1.0).check("strategy.pi", pi)
    Interval(float, 0.0, 1.0).check("strategy.theta", theta)
    labels, probabilities = _check_labels(labels, probabilities)
    n = labels.shape[0]
    losses = _check_losses(losses, n)
    noisy_rows = np.flatnonzero(_check_mask(noisy, n, "noisy"))
    # Rounded first so that e.g. 0.29 * 100 = 28.999999999999996 still yields 29 candidates.
    n_candidates = math.floor(round(pi * noisy_rows.size, 9))
    by_loss = noisy_rows[np.argsort(-losses[noisy_rows], kind="stable")]
    new_labels, changed = _relabel(labels, probabilities, by_loss[:n_candidates], theta)
    return new_labels, noisy_rows.size / n, changed


def stage2_relabel(
    labels: np.ndarray, probabilities: np.ndarray, *, theta: float, rows: np.ndarray | None = None,
    keep: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """End-of-stage-2 correction (Sec. 3.3, Algorithm 1 line 18, with the threshold of eq. (7)).

    Every sample whose max probability is >= theta gets the argmax label; with a boolean mask
    ``rows``, only the samples it marks may change; with ``keep``, a sample keeps its label where the
    model gives that label a probability >= keep (None: no label is kept for its probability, the
    paper). Returns (new labels, a copy; ascending indices whose label changed). Inputs are not
    modified.
    """
    Interval(float, 0.0, 1.0).check("strategy.theta", theta)
    Interval(float, 0.0, 1.0, closed="right", or_none=True).check("strategy.stage2_keep", keep)
    labels, probabilities = _check_labels(labels, probabilities)
    n = labels.shape[0]
    candidates = np.arange(n) if rows is None else np.flatnonzero(_check_mask(rows, n, "rows"))
    if keep is not None:
        candidates = candidates[probabilities[candidates, labels[candidates]] < keep]
    return _relabel(labels, probabilities, candidates, theta)
