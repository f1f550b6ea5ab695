"""FedCorr's metrics against ground truth: the honest noise-estimate error, and real label noise."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from data.scene import Scene
from protocol.fedcorr import CorrectRes, Diagnostics
from strategies.detection import (
    MISSING_DIAGNOSTICS_REASON,
    NO_NOISY_REASON,
    REAL_NOISE_REASON,
    counted_scores,
    detection_block,
    detection_scores,
    mean_abs_error,
    mean_squared_error,
    missing_diagnostics,
    scored_detection,
)
from strategies.fedcorr_metrics import FedCorrMonitor
from strategies.ground_truth import GroundTruth


def truth(noise: dict[int, float], size: int = 100, real: bool = False, known: int | None = None) -> GroundTruth:
    return GroundTruth(noisy_clients=frozenset(k for k, v in noise.items() if v > 0 and not real),
                       true_noise=dict(noise), sizes=dict.fromkeys(noise, size),
                       known=dict.fromkeys(noise, size if known is None else known), real_noise=real)


def corrected(known: int, wrong_before: int, wrong_after: int, **fields: Any) -> CorrectRes:
    """A correction reply whose every change made a wrong label right, with ground-truth counts and any
    other Diagnostics ``fields`` (the stage-1 split, the confusion counts)."""
    changed = wrong_before - wrong_after
    return CorrectRes(n_relabeled=changed, mu_hat=None,
                      diagnostics=Diagnostics(known=known, wrong_before=wrong_before, wrong_after=wrong_after,
                                              changed=changed, changed_correct=changed, **fields))


def test_the_noise_estimate_error_is_measured_on_the_labels_it_was_estimated_on():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.4, 1: 0.0}))
    # Iteration 1: client 0 estimates 0.4 on its original labels (40 of 100 wrong), then corrects 30.
    monitor.corrected({0: corrected(100, 40, 10)}, "stage1")
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [0], {0: 0.4, 1: 0.0})
    # Iteration 2: it estimates 0.1 on its corrected labels (10 wrong): exact, not 0.3 off.
    monitor.corrected({0: corrected(100, 10, 5)}, "stage1")
    monitor.end_iteration(2, {0: 8.0, 1: 5.0}, {0: 17.0, 1: 10.0}, [0], {0: 0.1, 1: 0.0})
    first, second = monitor.iterations
    assert first["noise_estimate_mae"] == pytest.approx(0.0)
    assert first["noise_estimate_mae_original"] == pytest.approx(0.0)
    assert second["noise_estimate_mae"] == pytest.approx(0.0)
    assert second["noise_estimate_mae_original"] == pytest.approx(0.15), "(|0.1 - 0.4| + 0) / 2"
    block = monitor.results()
    assert block["noise_estimate_mae"] == pytest.approx(0.0)
    assert block["noise_estimate_mae_original"] == pytest.approx(0.15)
    assert block["relabeled"] == 35 and block["relabel_by_step"] == {"stage1": {"relabeled": 35, "precision": 1.0}}
    row = {r["client"]: r for r in block["clients"]}[0]
    assert row["true_noise_estimated_on"] == pytest.approx(0.1) and row["true_noise_after"] == pytest.approx(0.05)
    assert row["mu_hat_error"] == pytest.approx(0.0) and row["mu_hat_error_original"] == pytest.approx(0.3)


def test_a_clean_reported_client_is_scored_on_its_unchanged_labels():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.4, 1: 0.2}))
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [], {0: 0.0, 1: 0.0})
    assert monitor.iterations[0]["noise_estimate_mae"] == pytest.approx(0.3)


def scene(true_labels: np.ndarray, noisy_labels: np.ndarray, noise_level: np.ndarray) -> Scene:
    n = true_labels.shape[0]
    return Scene(spec={"num_clients": 2}, indices=np.arange(n), client=np.repeat([0, 1], n // 2),
                 noisy_labels=noisy_labels, true_labels=true_labels, noise_level=noise_level)


def test_real_noise_is_recognised_from_the_scene():
    labels = np.arange(8) % 3
    synthetic = scene(labels, np.where(np.arange(8) < 2, (labels + 1) % 3, labels), np.array([0.5, 0.0]))
    assert not GroundTruth.from_scene(synthetic).real_noise, "only the noisy client's labels are wrong"
    # Clothing1M-like: the truth is known for part of the samples, and shipped labels are wrong
    # on a client no noise model touched.
    shipped = np.where(np.arange(8) == 5, (labels + 1) % 3, labels)
    real = GroundTruth.from_scene(scene(np.where(np.arange(8) % 2 == 0, -1, labels), shipped, np.zeros(2)))
    assert real.real_noise and real.known == {0: 2, 1: 2}
    assert real.true_noise[1] == pytest.approx(0.5) and real.label_subset().startswith("the 4 of 8 samples")
    wrong_on_clean = GroundTruth.from_scene(scene(labels, shipped, np.zeros(2)))
    assert wrong_on_clean.real_noise, "every label is known, but the dataset shipped a wrong one"


def test_a_client_without_samples_counts_none_known_and_has_no_noise_rate():
    labels = np.arange(4) % 2
    empty_last = Scene(spec={"num_clients": 3}, indices=np.arange(4), client=np.array([0, 0, 1, 1]),
                       noisy_labels=labels, true_labels=labels, noise_level=np.zeros(3))
    ground = GroundTruth.from_scene(empty_last)
    assert ground.sizes == {0: 2, 1: 2, 2: 0} and ground.known == {0: 2, 1: 2, 2: 0}
    assert ground.true_noise[0] == 0.0 and np.isnan(ground.true_noise[2])


def test_real_noise_reports_detection_as_not_applicable_and_noise_on_the_known_subset():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.5, 1: 0.0}, size=100, real=True, known=10))
    monitor.corrected({0: corrected(10, 5, 2)}, "stage1")
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [0], {0: 0.45, 1: 0.0})
    monitor.end_stage("after_stage1")
    block = json.loads(json.dumps(monitor.results()))
    assert block["detection"] is None and block["detection_not_applicable"] == REAL_NOISE_REASON
    assert block["true_noisy_clients"] is None and monitor.iterations[0]["detection"] is None
    assert all(row["true_noisy"] is None for row in block["clients"])
    assert block["label_noise"]["before"] == pytest.approx(0.25)
    assert block["label_noise"]["after_stage1"] == pytest.approx(0.1)
    assert block["label_noise_measured_on"] == "the 20 of 200 samples with a known true label (a clean annotation)"


def test_synthetic_noise_keeps_detection():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.5, 1: 0.0}))
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [0], {0: 0.45, 1: 0.0})
    block = monitor.results()
    assert block["detection"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert block["detection_not_applicable"] is None and block["label_noise_measured_on"] == "all 200 samples"


def test_without_any_noisy_client_detection_is_null_with_the_reason_not_0():
    """At (rho, tau) = (0, 0) nothing is noisy: flagging a client would score F1 0 and flagging none
    F1 1, either of which a table would average in."""
    for detected in ([0], []):
        monitor = FedCorrMonitor([0, 1], truth({0: 0.0, 1: 0.0}))
        monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, detected, {0: 0.1, 1: 0.0})
        block = json.loads(json.dumps(monitor.results()))
        assert block["detection"] is None and block["detection_not_applicable"] == NO_NOISY_REASON
        assert monitor.iterations[0]["detection"] is None
        assert block["true_noisy_clients"] == [] and block["detected_noisy_clients"] == detected
        assert block["label_noise"]["before"] == 0.0, "the rest is scored as usual"
    # The other methods report through the same block.
    clean = truth({0: 0.0, 1: 0.0, 2: 0.0})
    assert detection_block([1], clean) == {"detected_noisy_clients": [1], "true_noisy_clients": [],
                                           "detection": None, "detection_not_applicable": NO_NOISY_REASON}
    assert detection_block([1], truth({0: 0.0, 1: 0.3}))["detection"] == {"precision": 1.0, "recall": 1.0,
                                                                         "f1": 1.0}


def test_a_fedcorr_run_without_noise_reports_no_detection_score(run_inprocess):
    from reports.runs import Run
    from reports.tables import table_rows

    payload, _ = run_inprocess("experiment=smoke strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=1 "
                               "noise.rho=0 noise.tau=0 strategy.train.epochs=1")
    block = payload["fedcorr"]
    assert block["true_noisy_clients"] == [] and block["detected_noisy_clients"], "the paper's split always splits"
    assert block["detection"] is None and block["detection_not_applicable"] == NO_NOISY_REASON
    assert all(record["detection"] is None for record in block["iterations"])
    (row,) = table_rows({"clean": [Run(Path("run"), payload)]}, target=0.5)
    assert row["detection F1"] == "-"


def test_a_correction_without_ground_truth_counts_nulls_the_figures_that_need_them():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.4, 1: 0.0}))
    monitor.corrected({0: CorrectRes(n_relabeled=30, mu_hat=0.4)}, "stage1")
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [0], {0: 0.4, 1: 0.0})
    monitor.end_stage("after_stage1")
    block = json.loads(json.dumps(monitor.results()))
    assert block["label_noise_not_available"] == missing_diagnostics([0]) and "[0]" in missing_diagnostics([0])
    assert block["label_noise"] == {"before": 0.2, "after_stage1": None}
    assert block["relabeled"] is None and block["relabel_precision"] is None and block["relabel_by_step"] is None
    assert block["noise_estimate_mae"] is None and monitor.iterations[0]["noise_estimate_mae"] is None
    assert block["noise_estimate_mae_original"] == pytest.approx(0.0), "mu_hat against the scene's own truth"
    assert block["detection"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    rows = {row["client"]: row for row in block["clients"]}
    assert rows[0]["true_noise_after"] is None and rows[0]["mu_hat_error"] is None
    assert rows[1]["true_noise_after"] == 0.0
    assert monitor.arrays() == {} and block["confusion"] is None
    # A client with no known true label has nothing to send: no figure is lost for it.
    partial = FedCorrMonitor([0, 1], truth({0: 0.4, 1: 0.0}, known=0))
    partial.corrected({0: CorrectRes(n_relabeled=30, mu_hat=0.4)}, "stage1")
    assert partial.results()["label_noise_not_available"] is None


@pytest.mark.parametrize(("hits", "flagged", "actual", "expected"), [
    (1, 3, 2, (1 / 3, 1 / 2, 0.4)),  # F1 = 2 * (1/3) * (1/2) / (1/3 + 1/2) = (1/3) / (5/6)
    (2, 2, 2, (1.0, 1.0, 1.0)),
    (0, 0, 0, (1.0, 1.0, 1.0)),  # nothing flagged and nothing to find: nothing missed, nothing wrong
    (0, 0, 2, (0.0, 0.0, 0.0)),  # nothing flagged of two to find: F1 0, not 0 / 0
    (0, 2, 0, (0.0, 1.0, 0.0)),  # two flagged where there was nothing to find
])
def test_precision_recall_and_f1_from_counts(hits, flagged, actual, expected):
    scores = counted_scores(hits, flagged, actual)
    assert list(scores) == ["precision", "recall", "f1"]
    assert tuple(scores.values()) == pytest.approx(expected)


def test_detection_scores_count_distinct_clients_and_need_ground_truth():
    # Detected {1, 2} against noisy {2, 3}: one hit of two flagged and two to find.
    assert detection_scores([1, 2, 2], [2, 3]) == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5})
    assert scored_detection([1], None) is None
    # Real noise: no client is noisy by construction, so the truly noisy list is null, not empty.
    assert detection_block([0], truth({0: 0.5, 1: 0.0}, real=True)) == {
        "detected_noisy_clients": [0], "true_noisy_clients": None, "detection": None,
        "detection_not_applicable": REAL_NOISE_REASON}


def test_noise_estimate_errors_skip_clients_whose_truth_is_unknown():
    estimates = {0: 0.3, 1: 0.5, 2: 0.1}
    truth = {0: 0.1, 1: float("nan"), 2: 0.4}  # errors +0.2 and -0.3; client 1's truth is unknown
    assert mean_abs_error(estimates, truth) == pytest.approx((0.2 + 0.3) / 2)
    assert mean_squared_error(estimates, truth) == pytest.approx((0.04 + 0.09) / 2)
    unknown = dict.fromkeys(estimates, float("nan"))
    assert mean_abs_error(estimates, unknown) is None and mean_squared_error(estimates, unknown) is None


def test_the_missing_diagnostics_reason_names_the_first_ten_clients_in_order():
    assert missing_diagnostics([]) is None
    assert missing_diagnostics([3, 1]) == MISSING_DIAGNOSTICS_REASON.format(clients="[1, 3]")
    assert missing_diagnostics(range(9, -1, -1)) == MISSING_DIAGNOSTICS_REASON.format(
        clients="[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")
    assert missing_diagnostics(range(11)) == MISSING_DIAGNOSTICS_REASON.format(
        clients="[0, 1, 2, 3, 4, 5, 6, 7, 8, 9 ...]")
