"""Scoring what a noise-aware method believes about its clients against the scene's ground truth.

Every method that detects noisy clients or estimates per-client noise (FedCorr, FedNoRo, FedDiv,
FedES) reports through these, so their figures in results.json mean the same thing. Simulation only:
a deployed server has no ground truth. On a dataset whose labels are noisy themselves (real noise)
no client is noisy by construction, so detection is reported as null with ``REAL_NOISE_REASON``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from strategies.ground_truth import GroundTruth

REAL_NOISE_REASON = ("the dataset's labels are noisy themselves (real noise): no client is noisy by construction, "
                     "so there are no truly noisy clients to score detection against")


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


def detection_block(detected: Iterable[int], truth: GroundTruth | None) -> dict[str, Any]:
    """The clients a method treats as noisy, and with ground truth the truly noisy ones and the
    detection's precision, recall and F1 (null with the reason on real noise)."""
    block: dict[str, Any] = {"detected_noisy_clients": sorted(detected)}
    if truth is not None:
        real = truth.real_noise
        block.update({
            "true_noisy_clients": None if real else sorted(truth.noisy_clients),
            "detection": None if real else detection_scores(block["detected_noisy_clients"], truth.noisy_clients),
            "detection_not_applicable": REAL_NOISE_REASON if real else None,
        })
    return block
