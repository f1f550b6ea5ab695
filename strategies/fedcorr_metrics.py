"""FedCorr's detection and correction metrics against the scene's ground truth (simulation only).

A deployed server has no ground truth: then only what FedCorr itself estimates (LID scores, the
detected clients, mu_hat) is recorded. On a dataset whose labels are noisy themselves (real noise,
``GroundTruth.real_noise``) no client is noisy by construction, and in a scene without noise no client
is noisy at all: detection is not applicable and is reported as null with the reason. The label-noise
figures count the samples with a known true label only (``label_noise_measured_on`` names them) and
come from the clients' ground-truth counts; when a client whose truth the scene knows sends none (a
deployed node that does not allow them), every figure built from them is null with the reason
(``label_noise_not_available``). The per-client confusion counts go to ``confusion.npz``
(``arrays()``), not to results.json.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from common.run_files import CONFUSION, confusion_arrays
from common.text import counted
from protocol.fedcorr import CorrectRes
from strategies.detection import (
    detection_scores,
    mean_abs_error,
    missing_diagnostics,
    not_applicable,
    scored_detection,
)
from strategies.ground_truth import GroundTruth

SPLIT_KEYS = ("split_tp", "split_fp", "split_fn", "split_tn")
"""Per client, its latest stage-1 sample split against the truth: flagged and wrong, flagged but
right, not flagged but wrong, not flagged and right."""


class FedCorrMonitor:
    """Follows one FedCorr run: per-iteration LID, detection and noise-estimate error, label noise
    after each stage, and how precise the relabelling was. ``results()`` is the ``fedcorr`` block of
    results.json.

    Two noise-estimate errors, per iteration and client: against the true noise of the labels mu_hat
    was estimated on (the client's labels after the corrections of earlier iterations: what mu_hat
    estimates), and against the noise before any correction (``_original``), which also counts the
    earlier iterations' corrections as error.
    """

    def __init__(self, clients: list[int], truth: GroundTruth | None, late: frozenset[int] = frozenset()) -> None:
        self.clients = list(clients)
        self.truth = truth
        self.late = late
        # The true noise of each client's current labels; the clients' diagnostics update it.
        self.noise = dict(truth.true_noise) if truth else {}
        self.estimated_on: dict[int, float] = {}
        self._before_correction: dict[int, float] = {}
        self.iterations: list[dict[str, Any]] = []
        self.detected: list[int] = []
        self.cumulative: dict[int, float] = {}
        self.mu_hat: dict[int, float] = {}
        self.clean: list[int] = []
        # Labels changed, and changed to the true label, per correction step ("stage1", "stage2").
        self.changed: dict[str, int] = {}
        self.changed_correct: dict[str, int] = {}
        # Clients whose truth the scene knows but that answered a correction without ground-truth
        # counts: from then on the label-noise figures are unknown.
        self.missing: set[int] = set()
        self.label_noise: dict[str, float | None] = {"before": self._overall_noise()}
        # Per client: the confusion counts before its first correction and after its latest of each
        # stage (row-major M x M), and its latest stage-1 sample split against the truth.
        self.confusion: dict[int, dict[str, np.ndarray]] = {}
        self.split: dict[int, dict[str, int]] = {}

    def _overall_noise(self) -> float | None:
        """The share of wrong labels over every sample with a known true label (None once a client
        whose truth is known has corrected without telling how)."""
        if not self.truth or self.missing:
            return None
        counted = [k for k in self.clients if self.truth.known[k] > 0]
        total = sum(self.truth.known[k] for k in counted)
        return sum(self.noise[k] * self.truth.known[k] for k in counted) / total if total else None

    def _detection(self, detected: Iterable[int]) -> dict[str, float] | None:
        return scored_detection(detected, self.truth)

    def end_iteration(
        self,
        iteration: int,
        lid: Mapping[int, float],
        cumulative: Mapping[int, float],
        detected: list[int],
        mu_hat: Mapping[int, float],
        scores: Mapping[str, Mapping[int, float]] | None = None,
    ) -> None:
        """Record a finished stage-1 iteration (LID, the clients' other scores by name if the split read
        any, e.g. ``loss_share``, detected clients, every client's mu_hat) and print its line, with
        detection, noise-estimate error and label noise when there is ground truth. Call it after the
        iteration's ``corrected``."""
        self.detected, self.cumulative, self.mu_hat = list(detected), dict(cumulative), dict(mu_hat)
        record: dict[str, Any] = {
            "iteration": iteration,
            "lid": {str(k): v for k, v in sorted(lid.items())},
            "cumulative_lid": {str(k): v for k, v in sorted(cumulative.items())},
            "detected_noisy_clients": sorted(detected),
            "mu_hat": {str(k): v for k, v in sorted(mu_hat.items())},
        }
        for name, values in (scores or {}).items():
            record[name] = {str(k): v for k, v in sorted(values.items())}
        line = f"[fedcorr] stage 1 iteration {iteration}: {counted(len(detected), 'client')} detected noisy"
        if self.truth:
            # A client corrected now was estimated on its labels before this correction; any other
            # client's labels did not change in this iteration.
            self.estimated_on = {k: self._before_correction.get(k, self.noise[k]) for k in self.clients}
            estimates = {k: self.mu_hat[k] for k in self.clients}
            record["noise_estimate_mae"] = None if self.missing else mean_abs_error(estimates, self.estimated_on)
            record["noise_estimate_mae_original"] = mean_abs_error(estimates, self.truth.true_noise)
            record["detection"] = self._detection(detected)
            record["label_noise"] = self._overall_noise()
            d = record["detection"]
            if d is not None:
                line += f" (precision {d['precision']:.3f}, recall {d['recall']:.3f}, F1 {d['f1']:.3f})"
            if record["noise_estimate_mae"] is not None:
                line += f"; mu_hat MAE {record['noise_estimate_mae']:.4f}"
            if record["label_noise"] is not None:
                line += f"; label noise {record['label_noise']:.4f}"
        self._before_correction = {}
        self.iterations.append(record)
        print(line, flush=True)

    def corrected(self, replies: Mapping[int, CorrectRes], mode: str) -> None:
        """Fold in the ground-truth diagnostics clients return from ``query.correct`` in ``mode``; note
        the clients whose truth is known that returned none."""
        for pid, res in replies.items():
            counts = res.diagnostics
            if counts is None and self.truth and self.truth.known[pid] > 0:
                self.missing.add(pid)
            if counts is not None and counts.known > 0:
                self._before_correction[pid] = counts.wrong_before / counts.known
                self.noise[pid] = counts.wrong_after / counts.known
                self.changed[mode] = self.changed.get(mode, 0) + counts.changed
                self.changed_correct[mode] = self.changed_correct.get(mode, 0) + counts.changed_correct
                if counts.confusion_before is not None and counts.confusion_after is not None:
                    matrices = self.confusion.setdefault(
                        pid, {"before": np.asarray(counts.confusion_before, dtype=np.int64)})
                    matrices[f"after_{mode}"] = np.asarray(counts.confusion_after, dtype=np.int64)
                if counts.split_tp is not None:
                    self.split[pid] = {key: getattr(counts, key) for key in SPLIT_KEYS}

    def clean_set(self, clean: list[int]) -> None:
        """Record S_c, the clients stage 2 finetunes on."""
        self.clean = list(clean)

    def end_stage(self, key: str) -> None:
        """Record the label noise under ``key`` when a stage ends, and print it with ground truth."""
        self._before_correction = {}
        self.label_noise[key] = self._overall_noise()
        if self.truth and self.label_noise[key] is not None:
            print(f"[fedcorr] label noise over {self.truth.label_subset()} {key.replace('_', ' ')}: "
                  f"{self.label_noise[key]:.4f}", flush=True)

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
                estimate = self.mu_hat.get(pid, 0.0)
                on = self.estimated_on.get(pid, self.truth.true_noise[pid])
                original = self.truth.true_noise[pid]
                # A client that corrected without ground-truth counts: its labels' noise is unknown since.
                unknown = pid in self.missing
                row.update({
                    "n": self.truth.sizes[pid], "n_known": self.truth.known[pid],
                    "true_noisy": None if self.truth.real_noise else pid in self.truth.noisy_clients,
                    "true_noise_before": original, "true_noise_estimated_on": None if unknown else on,
                    "true_noise_after": None if unknown else self.noise[pid],
                    "mu_hat_error": abs(estimate - on) if np.isfinite(on) and not unknown else None,
                    "mu_hat_error_original": abs(estimate - original) if np.isfinite(original) else None,
                    **{key: self.split.get(pid, {}).get(key) for key in SPLIT_KEYS},
                })
            rows.append(row)
        return rows

    def results(self) -> dict[str, Any]:
        """The ``fedcorr`` block of results.json (with ground truth: detection, noise and relabelling figures)."""
        block: dict[str, Any] = {
            "detected_noisy_clients": sorted(self.detected),
            "finetune_clients": sorted(self.clean),
            "iterations": self.iterations,
            # query.loss messages of the disagreement score: each sends the global model to a client and
            # brings back three scalars (loss, accuracy, sample count); comm_cost counts training only.
            "disagreement_queries": sum(len(record.get("disagreement", {})) for record in self.iterations),
            "clients": self.client_rows(),
        }
        if self.truth:
            estimates = {k: self.mu_hat.get(k, 0.0) for k in self.clients}
            changed, correct = sum(self.changed.values()), sum(self.changed_correct.values())
            unknown = missing_diagnostics(self.missing)
            block.update({
                "true_noisy_clients": None if self.truth.real_noise else sorted(self.truth.noisy_clients),
                "detection": self._detection(self.detected),
                "detection_not_applicable": not_applicable(self.truth),
                "noise_estimate_mae": None if unknown else mean_abs_error(estimates,
                                                                          self.estimated_on or self.truth.true_noise),
                "noise_estimate_mae_original": mean_abs_error(estimates, self.truth.true_noise),
                "label_noise": dict(self.label_noise),
                "label_noise_measured_on": self.truth.label_subset(),
                "relabel_precision": None if unknown or not changed else correct / changed,
                "relabeled": None if unknown else changed,
                "relabel_by_step": None if unknown else {
                    mode: {"relabeled": n, "precision": self.changed_correct[mode] / n if n else None}
                    for mode, n in self.changed.items()},
                "label_noise_not_available": unknown,
                "late_joiners": self._late_joiners(),
                # The counts themselves are in confusion.npz (``arrays``): M x M per client and point.
                "confusion": {"file": CONFUSION, "clients": len(self.confusion)} if self.confusion else None,
            })
        return block

    def _late_joiners(self) -> dict[str, Any] | None:
        """How the clients that joined late were read: how many are noisy, how many of those were
        flagged, and the detection among them alone (null without late joiners or with nothing to score)."""
        if not self.late or self.truth is None:
            return None
        noisy, flagged = self.late & self.truth.noisy_clients, self.late & set(self.detected)
        return {"clients": len(self.late), "noisy": len(noisy), "flagged": len(flagged),
                "missed": len(noisy - flagged),
                "detection": None if not_applicable(self.truth) else detection_scores(flagged, noisy)}

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The run folder's array files (name -> arrays): the clients' confusion counts, if any came."""
        return {CONFUSION: confusion_arrays(self.confusion)} if self.confusion else {}
