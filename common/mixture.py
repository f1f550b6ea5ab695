"""FedCorr's two-way splits: a 2-component Gaussian mixture on 1-D scores, high component = noisy.

The server splits clients by cumulative LID (paper Sec. 3.2 step 1); a client splits its samples
by per-sample loss (step 2). Both are the same operation on different scores.
"""

from __future__ import annotations

import numpy as np

# Scores whose spread is below this share of their magnitude are one population.
SPREAD_TOLERANCE = 1e-6


def high_component(scores: np.ndarray, seed: int) -> np.ndarray:
    """Boolean mask of the scores assigned to the component with the larger mean.

    Fewer than two scores, or scores that are all (nearly) the same, carry no split: nobody is
    flagged. ``seed`` is scikit-learn's ``random_state``, so the split is reproducible.
    """
    values = np.asarray(scores, dtype=np.float64).reshape(-1, 1)
    if values.shape[0] < 2 or np.ptp(values) <= SPREAD_TOLERANCE * max(1.0, float(np.abs(values).max())):
        return np.zeros(values.shape[0], dtype=bool)
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    mixture = GaussianMixture(n_components=2, random_state=seed).fit(values)
    return mixture.predict(values) == int(np.argmax(mixture.means_.ravel()))
