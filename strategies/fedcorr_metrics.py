"""FedCorr's detection and correction metrics against the scene's ground truth (simulation only).

A deployed server has no ground truth: then only what FedCorr itself estimates (LID scores, the
detected clients, mu_hat) is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from protocol.fedcorr import CorrectRes
from strategies.ground_truth import GroundTruth


def detection_scores(detected: Iterable[int], truth: Iterable[int]) -> dict[str, float]:
    """Precision, recall and F1 of the detected noisy clients (1.0 where nothing was to be found)."""
    detected, truth = set(detected), set(truth)
    hits = len(detected & truth)
    precision = hits / len(detected) if detected else (1.0 if not truth else 0.0)
    recall = hits / len(truth) if truth else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


class FedCorrMonitor:
    """Follows one FedCorr run: per-iteration LID and detection, label noise after each stage,
    and how precise the relabelling was. ``results()`` is the ``fedcorr`` block of results.json."""

    def __init__(self, clients: list[int], truth: GroundTruth | None) -> None:
        self.clients = list(clients)
        self.truth = truth
        self.noise = dict(truth.true_noise) if truth else {}
        self.iterations: list[dict[str, Any]] = []
        self.detected: list[int] = []
        self.cumulative: dict[int, float] = {}
        self.mu_hat: dict[int, float] = {}
        self.clean: list[int] = []
        self.changed = 0
        self.changed_correct = 0
        self.label_noise: dict[str, float | None] = {"before": self._overall_noise()}

    def _overall_noise(self) -> float | None:
        if not self.truth:
            return None
        total = sum(self.truth.sizes[k] for k in self.clients)
        return sum(self.noise[k] * self.truth.sizes[k] for k in self.clients) / total

    def end_iteration(
        self,
        iteration: int,
        lid: Mapping[int, float],
        cumulative: Mapping[int, float],
        detected: list[int],
        mu_hat: Mapping[int, float],
    ) -> None:
        """Record a finished stage-1 iteration (LID, detected clients, mu_hat) and print its line,
        with detection scores and label noise when there is ground truth."""
        self.detected, self.cumulative, self.mu_hat = list(detected), dict(cumulative), dict(mu_hat)
        record: dict[str, Any] = {
            "iteration": iteration,
            "lid": {str(k): v for k, v in sorted(lid.items())},
            "cumulative_lid": {str(k): v for k, v in sorted(cumulative.items())},
            "detected_noisy_clients": sorted(detected),
            "mu_hat": {str(k): v for k, v in sorted(mu_hat.items())},
        }
        line = f"[fedcorr] stage 1 iteration {iteration}: {len(detected)} clients detected noisy"
        if self.truth:
            record["detection"] = detection_scores(detected, self.truth.noisy_clients)
            record["label_noise"] = self._overall_noise()
            d = record["detection"]
            line += (f" (precision {d['precision']:.3f}, recall {d['recall']:.3f}, F1 {d['f1']:.3f});"
                     f" label noise {record['label_noise']:.4f}")
        self.iterations.append(record)
        print(line, flush=True)

    def corrected(self, replies: Mapping[int, CorrectRes]) -> None:
        """Fold in the ground-truth diagnostics clients return from ``query.correct``."""
        for pid, res in replies.items():
            counts = res.diagnostics
            if counts is not None and counts.known > 0:
                self.noise[pid] = counts.wrong_after / counts.known
                self.changed += counts.changed
                self.changed_correct += counts.changed_correct

    def clean_set(self, clean: list[int]) -> None:
        """Record S_c, the clients stage 2 finetunes on."""
        self.clean = list(clean)

    def end_stage(self, key: str) -> None:
        """Record the label noise under ``key`` when a stage ends, and print it with ground truth."""
        self.label_noise[key] = self._overall_noise()
        if self.truth:
            print(f"[fedcorr] label noise over all samples {key.replace('_', ' ')}: {self.label_noise[key]:.4f}",
                  flush=True)

    def client_rows(self) -> list[dict[str, Any]]:
        """One row per client for fedcorr_clients.csv."""
        rows = []
        for pid in self.clients:
            row: dict[str, Any] = {
                "client": pid,
                "cumulative_lid": self.cumulative.get(pid),
                "detected_noisy": pid in set(self.detected),
                "mu_hat": self.mu_hat.get(pid),
                "finetuned": pid in set(self.clean),
            }
            if self.truth:
                row.update({"n": self.truth.sizes[pid], "true_noisy": pid in self.truth.noisy_clients,
                            "true_noise_before": self.truth.true_noise[pid], "true_noise_after": self.noise[pid]})
            rows.append(row)
        return rows

    def results(self) -> dict[str, Any]:
        """The ``fedcorr`` block of results.json (with ground truth: detection, noise and relabelling figures)."""
        block: dict[str, Any] = {
            "detected_noisy_clients": sorted(self.detected),
            "finetune_clients": sorted(self.clean),
            "iterations": self.iterations,
            "clients": self.client_rows(),
        }
        if self.truth:
            errors = [abs(self.mu_hat.get(k, 0.0) - self.truth.true_noise[k]) for k in self.clients]
            block.update({
                "true_noisy_clients": sorted(self.truth.noisy_clients),
                "detection": detection_scores(self.detected, self.truth.noisy_clients),
                "noise_estimate_mae": float(np.mean(errors)),
                "label_noise": dict(self.label_noise),
                "relabel_precision": self.changed_correct / self.changed if self.changed else None,
                "relabeled": self.changed,
            })
        return block
