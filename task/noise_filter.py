"""FedDiv's noise filter (Li et al., AAAI 2024, Sec. 3; ``docs/feddiv.md``): a
2-component 1-D Gaussian mixture on a client's min-max normalised per-sample losses.

Normalising the losses to [0, 1] is what makes filters of different clients comparable, so the
server can average their parameters into a global filter. The component with the smaller mean is
the clean one; a sample's clean posterior decides its side.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

# The local EM's variance floor and stopping rule (scikit-learn's reg_covar and tol).
VARIANCE_FLOOR = 1e-6
TOLERANCE = 1e-3
MAX_ITERATIONS = 100


@dataclass(frozen=True)
class NoiseFilter:
    """The mixture's parameters: component ``clean`` has the smaller mean."""

    mean_clean: float
    mean_noisy: float
    var_clean: float
    var_noisy: float
    weight_clean: float
    weight_noisy: float

    @property
    def means(self) -> np.ndarray:
        """(clean, noisy) means."""
        return np.array([self.mean_clean, self.mean_noisy])

    @property
    def variances(self) -> np.ndarray:
        """(clean, noisy) variances."""
        return np.array([self.var_clean, self.var_noisy])

    @property
    def weights(self) -> np.ndarray:
        """(clean, noisy) mixing weights."""
        return np.array([self.weight_clean, self.weight_noisy])

    @classmethod
    def ordered(cls, means: np.ndarray, variances: np.ndarray, weights: np.ndarray) -> NoiseFilter:
        """The filter of two components given in any order (the smaller mean becomes ``clean``)."""
        c, n = (0, 1) if means[0] <= means[1] else (1, 0)
        return cls(float(means[c]), float(means[n]), float(variances[c]), float(variances[n]),
                   float(weights[c]), float(weights[n]))


FIXED_FILTER = NoiseFilter(0.25, 0.75, 0.0625, 0.0625, 0.5, 0.5)
"""A filter to start from without any fitted one: means 0.25 / 0.75, sd 0.25, equal weights."""


# The released code's first global filter is fitted to random numbers: this many, uniform in [0, 1].
RANDOM_SAMPLES = 1000


def random_filter(seed: int) -> NoiseFilter:
    """A filter fitted to ``RANDOM_SAMPLES`` uniform numbers in [0, 1] drawn with ``seed`` (the
    released code's uninformative start: roughly the two halves of the unit interval)."""
    return fit_filter(np.random.default_rng(seed).uniform(size=RANDOM_SAMPLES), seed)


def min_max(values: np.ndarray) -> np.ndarray:
    """``values`` scaled to [0, 1] (all equal: all 0)."""
    values = np.asarray(values, dtype=np.float64)
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def clean_posterior(losses: np.ndarray, noise_filter: NoiseFilter) -> np.ndarray:
    """Each normalised loss's posterior probability of the clean component."""
    x = np.asarray(losses, dtype=np.float64)[:, None]
    var = noise_filter.variances[None, :]
    log_density = -0.5 * (np.log(2 * np.pi * var) + (x - noise_filter.means[None, :]) ** 2 / var)
    with np.errstate(divide="ignore"):
        log_joint = log_density + np.log(noise_filter.weights)[None, :]
    log_joint -= log_joint.max(axis=1, keepdims=True)
    joint = np.exp(log_joint)
    return joint[:, 0] / joint.sum(axis=1)


def fit_filter(losses: np.ndarray, seed: int, start: NoiseFilter | None = None,
               max_iterations: int | None = None) -> NoiseFilter:
    """The filter EM fits to normalised ``losses``: from ``start`` when given (FedDiv's local EM
    starts from the global filter), else from k-means; run to convergence (``TOLERANCE`` on the mean
    log-likelihood, at most ``MAX_ITERATIONS``) or for ``max_iterations`` steps."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    x = np.asarray(losses, dtype=np.float64).reshape(-1, 1)
    if x.shape[0] < 2 or np.ptp(x) == 0:
        # No spread: nothing to separate; every sample sits in the clean component.
        return NoiseFilter(float(x.mean()), 1.0, VARIANCE_FLOOR, VARIANCE_FLOOR, 1.0, 0.0)
    options: dict = {}
    if start is not None:
        weights = np.clip(start.weights, 1e-6, None)
        options = {"weights_init": weights / weights.sum(), "means_init": start.means.reshape(2, 1),
                   "precisions_init": (1.0 / np.maximum(start.variances, VARIANCE_FLOOR)).reshape(2, 1, 1)}
    mixture = GaussianMixture(n_components=2, covariance_type="full", reg_covar=VARIANCE_FLOOR, tol=TOLERANCE,
                              max_iter=max_iterations or MAX_ITERATIONS, random_state=seed, **options)
    with warnings.catch_warnings():
        # A fixed number of EM steps (the released code's 3) stops before convergence on purpose.
        warnings.simplefilter("ignore", ConvergenceWarning)
        mixture.fit(x)
    return NoiseFilter.ordered(mixture.means_.ravel(), mixture.covariances_.ravel(), mixture.weights_)


def aggregate_filters(filters: list[NoiseFilter], sizes: list[float], squared_weights: bool = False) -> NoiseFilter:
    """The global filter (FedDiv eq. 5): each parameter averaged with weights gamma_k = n_k / sum n;
    the variances with gamma_k^2 under ``squared_weights`` (the released code), which narrows them."""
    gamma = np.asarray(sizes, dtype=np.float64) / float(sum(sizes))
    stack = {name: np.array([getattr(f, name) for f in filters]) for name in NoiseFilter.__dataclass_fields__}
    var_weights = gamma ** 2 if squared_weights else gamma
    return NoiseFilter(
        mean_clean=float(gamma @ stack["mean_clean"]), mean_noisy=float(gamma @ stack["mean_noisy"]),
        var_clean=float(var_weights @ stack["var_clean"]), var_noisy=float(var_weights @ stack["var_noisy"]),
        weight_clean=float(gamma @ stack["weight_clean"]), weight_noisy=float(gamma @ stack["weight_noisy"]),
    )
