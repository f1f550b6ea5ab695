"""Local intrinsic dimensionality (LID): the MLE of FedCorr eq. (2) and a client's LID score.

Two guards keep the estimate finite on real prediction vectors, where a well-trained model often
outputs the same (saturated) softmax vector for many samples:

* Distances are clamped at a floor, ``DISTANCE_FLOOR`` times the set's radius (the largest distance of
  a point from the centroid). Float32 softmax outputs resolve about 1e-7 and the squared-distance
  expansion below loses about 1e-8 of the radius, so anything closer than the floor is rounding, not
  geometry: exact duplicates count as "very close" instead of producing log(0) = -inf.
* A point whose k neighbour distances are all equal after the floor (at least k duplicates of it, or
  always when k = 1) shows no growth of its neighbourhood with the radius, and eq. (2) is 1/0. Its
  estimate is defined as 0: for the usual cause, a point mass of duplicates, 0 is the true dimension and
  the limit of eq. (2) as the duplicates' distances shrink; in the other cases there is nothing to
  measure, and 0 keeps the client's mean finite.
"""

from __future__ import annotations

import numpy as np

from common.errors import ConfigError
from common.validation import Interval

DISTANCE_FLOOR = 1e-6
# Rows of the distance matrix computed at once, as a number of matrix entries (float64): 32 MiB.
CHUNK_ENTRIES = 2**22


def _check_points(points: np.ndarray) -> np.ndarray:
    array = np.asarray(points)
    if array.ndim != 2 or array.shape[0] < 2 or array.shape[1] < 1:
        raise ConfigError(
            f"points of shape {array.shape} are invalid: allowed is at least 2 points, shape (n, d)"
        )
    if not np.issubdtype(array.dtype, np.number) or not np.isfinite(array).all():
        raise ConfigError(f"points of dtype {array.dtype} are invalid: allowed are finite real numbers")
    return array.astype(np.float64)


def _neighbour_distances(points: np.ndarray, k: int) -> np.ndarray:
    """Distances (n, k) from each point to its k nearest other points, in no particular order."""
    n = points.shape[0]
    sq_norms = np.einsum("ij,ij->i", points, points)
    rows_per_chunk = max(1, CHUNK_ENTRIES // n)
    nearest = np.empty((n, k))
    for start in range(0, n, rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, n))
        sq = sq_norms[rows, None] + sq_norms[None, :] - 2.0 * points[rows] @ points.T
        np.maximum(sq, 0.0, out=sq)  # the expansion can dip below 0 through rounding
        # The point itself is excluded, even where it has exact duplicates elsewhere in the set.
        sq[np.arange(sq.shape[0]), np.arange(rows.start, rows.stop)] = np.inf
        nearest[rows] = np.partition(sq, k - 1, axis=1)[:, :k]
    return np.sqrt(nearest)


def lid_mle(points: np.ndarray, k: int) -> np.ndarray:
    """Per-point MLE of eq. (2) w.r.t. the k nearest OTHER points of the set (the point itself excluded).

    LID(x) = -((1/k) sum_i log(r_i / r_max))^-1 with Euclidean distances r_i; see the module docstring
    for the distance floor and the value 0 of degenerate neighbourhoods. ``points`` is (n, d) with
    n >= 2, and 1 <= k <= n - 1. Returns float64 of shape (n,), finite and >= 0.
    """
    array = _check_points(points)
    Interval(int, 1).check("k", k)
    n = array.shape[0]
    if k > n - 1:
        raise ConfigError(f"k={k} is invalid for {n} points: allowed is an integer <= {n - 1}")
    # Centring loses nothing (distances are translation invariant) and keeps the norms in the
    # squared-distance expansion, and so its rounding error, at the scale of the set itself.
    centred = array - array.mean(axis=0)
    radius = float(np.sqrt(np.einsum("ij,ij->i", centred, centred).max()))
    floor = max(DISTANCE_FLOOR * radius, np.finfo(np.float64).tiny)
    distances = np.maximum(_neighbour_distances(centred, k), floor)
    log_ratios = np.log(distances / distances.max(axis=1, keepdims=True)).sum(axis=1)
    # log_ratios is exactly 0 where every ratio is exactly 1 (the degenerate case), and < 0 otherwise.
    degenerate = log_ratios == 0.0
    return np.where(degenerate, 0.0, -k / np.where(degenerate, -1.0, log_ratios))


def lid_score(probabilities: np.ndarray, k: int = 20) -> float:
    """FedCorr's client LID score: mean of lid_mle over the client's softmax prediction vectors.

    Uses k_eff = min(k, n - 1) neighbours, so a small client still gets a score; FedCorr fixes k = 20.
    A client needs at least 2 samples. The result is always finite and >= 0.
    """
    Interval(int, 1).check("k", k)
    array = np.asarray(probabilities)
    if array.ndim != 2 or array.shape[0] < 2:
        raise ConfigError(
            f"probabilities of shape {array.shape} are invalid: "
            "allowed is (n, M) with n >= 2 (an LID needs at least 2 samples)"
        )
    return float(lid_mle(array, min(k, array.shape[0] - 1)).mean())
