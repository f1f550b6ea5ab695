"""FedES's quality estimate from the estimation round's weights, in NumPy (``docs/fedes.md``).

For the parameter set P (``task.critical_parameters``, the rule SeGD uses too), with W_start the
global model the clients started from, or per client its own upload of the round before:

- criticality of parameters (CoP): g = |(W_after - W_start) * W_start| over P, flattened; one g_n
  per client and g_s for the round's FedAvg;
- mu: a summary of each g: the mean of the higher-mean component of a 2-component GMM fitted
  to a seeded subsample, or the plain mean;
- d_n = sign(mu_n - mu_s) * EMD(g_n, g_s), the 1-D Wasserstein-1 distance of the two samples;
- rho_n: d min-max normalised over the clients, optionally floored.

Nothing here needs more than the weights FedAvg already receives.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from common.seeding import rng_for
from task.critical_parameters import in_parameter_set

# The summary of a CoP vector: gmm (the higher-mean component's mean) | arithmetic_mean.
MU_ESTIMATORS = ("gmm", "arithmetic_mean")
# The GMM is fitted to at most this many entries of a CoP vector (FedES's spec: 10^5).
GMM_SAMPLE = 100_000
# CoP vectors whose spread is below this share of their magnitude are one population: no GMM.
SPREAD_TOLERANCE = 1e-12


def parameter_set(state: Mapping[str, np.ndarray], parameter_names: Collection[str], mask_params: str) -> list[str]:
    """The names of P in ``state``'s order: trainable parameters that ``mask_params`` selects."""
    return [name for name, array in state.items()
            if name in parameter_names and in_parameter_set(np.shape(array), mask_params)]


def flat(state: Mapping[str, np.ndarray], names: list[str]) -> np.ndarray:
    """The arrays ``names`` of ``state`` concatenated into one float64 vector."""
    return np.concatenate([np.asarray(state[name], dtype=np.float64).ravel() for name in names])


def criticality(after: np.ndarray, start: np.ndarray) -> np.ndarray:
    """CoP: |(after - start) * start|, entry by entry."""
    return np.abs((after - start) * start)


def cop_summary(values: np.ndarray, estimator: str, seed: int) -> float:
    """The summary mu of a CoP vector: ``gmm`` (the higher-mean component of a 2-component 1-D GMM with
    ``random_state=seed``, fitted to a subsample of at most ``GMM_SAMPLE`` entries drawn from the
    run's seed, the same positions for every vector of one length) or ``arithmetic_mean``."""
    if estimator not in MU_ESTIMATORS:
        raise ValueError(f"mu estimator {estimator!r} is unknown: allowed are {', '.join(MU_ESTIMATORS)}")
    if estimator == "arithmetic_mean":
        return float(values.mean())
    if values.size > GMM_SAMPLE:
        values = values[rng_for(seed, "fedes-mu-sample").choice(values.size, GMM_SAMPLE, replace=False)]
    if values.size < 2 or np.ptp(values) <= SPREAD_TOLERANCE * max(1.0, float(np.abs(values).max())):
        return float(values.mean())  # one population: both components would be the same
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    # CoP values are tiny (|update * weight| ~ 1e-5); fitted as they are, scikit-learn's variance
    # floor (reg_covar = 1e-6) would swamp both components. Fitted in units of their spread instead.
    # In one dimension a diagonal covariance is the full one; scikit-learn fits it some 4x faster.
    scale = float(values.std())
    mixture = GaussianMixture(n_components=2, covariance_type="diag", random_state=seed).fit(
        (values / scale).reshape(-1, 1))
    return float(mixture.means_.max()) * scale


def wasserstein_1d(a: np.ndarray, b: np.ndarray) -> float:
    """The 1-D Wasserstein-1 (earth mover's) distance of two equal-size samples: mean |sort(a) - sort(b)|."""
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"samples of shapes {a.shape} and {b.shape}: allowed are two 1-D samples of one size")
    return float(np.mean(np.abs(np.sort(a) - np.sort(b))))


def signed_distance(mu: float, mu_global: float, emd: float) -> float:
    """The signed distance d = sign(mu - mu_global) * emd, with sign(0) = 0."""
    return float(np.sign(mu - mu_global)) * emd


def min_max_quality(distances: Mapping[int, float], floor: float = 0.0) -> dict[int, float]:
    """rho_n = (d_n - min d) / (max d - min d), raised to ``floor`` where below it.

    When every d is the same, no client looks worse than another: every rho is 1, so SeGD trains
    plainly and NaAgg weighs by set size, i.e. FedES falls back to FedAvg rather than divide by zero.
    """
    values = np.array(list(distances.values()), dtype=np.float64)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if high == low:
        return dict.fromkeys(distances, 1.0)
    return {pid: max(floor, (d - low) / (high - low)) for pid, d in distances.items()}


@dataclass(frozen=True)
class QualityEstimate:
    """One estimation: per client its distance d, its mu and rho; mu_global is the FedAvg's mu."""

    distance: dict[int, float]
    mu: dict[int, float]
    rho: dict[int, float]
    mu_global: float


def estimate_quality(
    start: Mapping[str, np.ndarray],
    clients: Mapping[int, Mapping[str, np.ndarray]],
    aggregate: Mapping[str, np.ndarray],
    names: list[str],
    *,
    estimator: str,
    seed: int,
    floor: float = 0.0,
    client_starts: Mapping[int, Mapping[str, np.ndarray]] | None = None,
) -> QualityEstimate:
    """The quality rho of every client from the round's states: ``start`` (W_start), ``clients`` (partition id ->
    its trained state) and their ``aggregate``, over the arrays ``names`` (P). ``client_starts``: a
    client's own W_start in its CoP (the other reading of W_start; ``start`` for the clients it lacks; the
    global CoP always uses ``start``). One client's CoP at a time, so memory stays at a few copies of
    P whatever the federation's size."""
    origin = flat(start, names)
    global_cop = criticality(flat(aggregate, names), origin)
    mu_global = cop_summary(global_cop, estimator, seed)
    distances: dict[int, float] = {}
    mus: dict[int, float] = {}
    for pid, state in clients.items():
        own = (client_starts or {}).get(pid)
        cop = criticality(flat(state, names), origin if own is None else flat(own, names))
        mus[pid] = cop_summary(cop, estimator, seed)
        distances[pid] = signed_distance(mus[pid], mu_global, wasserstein_1d(cop, global_cop))
    return QualityEstimate(distances, mus, min_max_quality(distances, floor), mu_global)
