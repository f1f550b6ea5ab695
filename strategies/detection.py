"""Scoring what a noise-aware method believes about its clients against the scene's ground truth.

Every method that detects noisy clients or estimates per-client noise (FedCorr, FedNoRo, FedDiv,
FedES) reports through these, so their figures in results.json mean the same thing. Simulation only:
a deployed server has no ground truth. Detection is scored only where there are truly noisy clients
to find: on a dataset whose labels are noisy themselves (real noise) no client is noisy by
construction, and in a scene without noise (rho = 0 or tau = 0) no client is noisy at all, so
detection is reported as null with the reason (``detection_not_applicable``), never as a 0 or a 1
that a table would average in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from strategies.ground_truth import GroundTruth

REAL_NOISE_REASON = ("the dataset's labels are noisy themselves (real noise): no client is noisy by construction, "
                     "so there are no truly noisy clients to score detection against")
NO_NOISY_REASON = ("no client of the scene is noisy (the noise model left every client clean): there is nothing "
                   "to detect, so recall and F1 are undefined")
MISSING_DIAGNOSTICS_REASON = ("clients {clients} sent no ground-truth counts (a node sends them in simulation, or "
                              "deployed with node config ground-truth-diagnostics=true): the figures that need them "
                              "are null")


def counted_scores(hits: int, flagged: int, actual: int) -> dict[str, float]:
    """Precision, recall and F1 from counts: ``hits`` of the ``flagged`` items are among the
    ``actual`` ones (precision 1.0 when nothing was flagged and nothing was to be found, recall 1.0
    when nothing was to be found)."""
    precision = hits / flagged if flagged else (1.0 if not actual else 0.0)
    recall = hits / actual if actual else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def detection_scores(detected: Iterable[int], truth: Iterable[int]) -> dict[str, float]:
    """Precision, recall and F1 of the detected noisy clients (see ``counted_scores``)."""
    detected, truth = set(detected), set(truth)
    return counted_scores(len(detected & truth), len(detected), len(truth))


def mean_abs_error(estimates: Mapping[int, float], truth: Mapping[int, float]) -> float | None:
    """Mean |estimate - truth| over the clients whose truth is known (None if none is)."""
    errors = [abs(estimates[k] - truth[k]) for k in estimates if np.isfinite(truth[k])]
    return float(np.mean(errors)) if errors else None


def mean_squared_error(estimates: Mapping[int, float], truth: Mapping[int, float]) -> float | None:
    """Mean (estimate - truth)^2 over the clients whose truth is known (None if none is)."""
    errors = [(estimates[k] - truth[k]) ** 2 for k in estimates if np.isfinite(truth[k])]
    return float(np.mean(errors)) if errors else None


def not_applicable(truth: GroundTruth) -> str | None:
    """Why detection cannot be scored against ``truth`` (real noise, or no noisy client), or None."""
    if truth.real_noise:
        return REAL_NOISE_REASON
    if not truth.noisy_clients:
        return NO_NOISY_REASON
    return None


def scored_detection(detected: Iterable[int], truth: GroundTruth | None) -> dict[str, float] | None:
    """Precision, recall and F1 of ``detected`` against the truly noisy clients; None without ground
    truth or where ``not_applicable`` gives a reason."""
    if truth is None or not_applicable(truth) is not None:
        return None
    return detection_scores(detected, truth.noisy_clients)


def missing_diagnostics(clients: Iterable[int]) -> str | None:
    """The reason figures built from the clients' ground-truth counts are null: ``clients`` (whose
    true labels the scene knows) sent none. None when every client sent them."""
    missing = sorted(clients)
    if not missing:
        return None
    shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
    return MISSING_DIAGNOSTICS_REASON.format(clients=f"[{shown}]")


def detection_block(detected: Iterable[int], truth: GroundTruth | None) -> dict[str, Any]:
    """The clients a method treats as noisy, and with ground truth the truly noisy ones and the
    detection's precision, recall and F1 (null with the reason on real noise or without noise)."""
    block: dict[str, Any] = {"detected_noisy_clients": sorted(detected)}
    if truth is not None:
        block.update({
            "true_noisy_clients": None if truth.real_noise else sorted(truth.noisy_clients),
            "detection": scored_detection(block["detected_noisy_clients"], truth),
            "detection_not_applicable": not_applicable(truth),
        })
    return block
