"""FedCorrMonitor fed by hand: which correction replies count, the confusion counts and the stage-1
splits it keeps, its console lines and the rows of fedcorr_clients.csv."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_fedcorr_metrics import corrected, truth

from common.run_files import CONFUSION, CONFUSION_POINTS
from protocol.fedcorr import CorrectRes
from strategies.fedcorr_metrics import SPLIT_KEYS, FedCorrMonitor
from strategies.ground_truth import GroundTruth

EYE = (5, 1, 0, 4)  # a 2-class confusion (true, held), row-major: 1 of 5 class-0 labels held as 1


def sized(known: dict[int, int]) -> GroundTruth:
    """Ground truth with ``known`` true labels per client, out of 10 samples each."""
    return GroundTruth(noisy_clients=frozenset(known), true_noise=dict.fromkeys(known, 0.5),
                       sizes=dict.fromkeys(known, 10), known=dict(known))


def test_a_client_with_one_known_label_is_counted_and_one_with_none_is_skipped():
    monitor = FedCorrMonitor([0, 1], sized({0: 1, 1: 0}))
    monitor.corrected({0: corrected(1, 1, 0), 1: corrected(0, 0, 0)}, "stage1")
    assert monitor.noise[0] == 0.0 and monitor.changed == {"stage1": 1}
    assert monitor.noise[1] == 0.5, "nothing known: the scene's own figure stands"
    assert not monitor.missing


def test_only_a_client_whose_truth_is_known_is_missing_when_it_sends_no_counts():
    monitor = FedCorrMonitor([0, 1], sized({0: 1, 1: 0}))
    bare = CorrectRes(n_relabeled=0, mu_hat=0.1)
    monitor.corrected({0: bare, 1: bare}, "stage1")
    assert monitor.missing == {0}
    late = FedCorrMonitor([0, 5], sized({0: 3, 5: 0}))
    late.corrected({5: bare}, "stage1")
    assert late.missing == set(), "client 5 knows no true label; client 0's count is not its"


def test_the_first_correction_keeps_the_before_counts_and_each_stage_its_latest_after():
    monitor = FedCorrMonitor([0, 1], sized({0: 10, 1: 10}))
    monitor.corrected({0: corrected(10, 2, 1, confusion_before=(4, 1, 1, 4), confusion_after=EYE)}, "stage1")
    monitor.corrected({0: corrected(10, 1, 1, confusion_before=EYE, confusion_after=(5, 0, 1, 4))}, "stage1")
    monitor.corrected({0: corrected(10, 1, 0, confusion_before=(5, 0, 1, 4), confusion_after=(5, 0, 0, 5))}, "stage2")
    kept = monitor.confusion[0]
    assert sorted(kept) == ["after_stage1", "after_stage2", "before"]
    assert kept["before"].tolist() == [4, 1, 1, 4], "before the first correction, not the second"
    assert kept["after_stage1"].tolist() == [5, 0, 1, 4] and kept["after_stage2"].tolist() == [5, 0, 0, 5]
    arrays = monitor.arrays()
    assert list(arrays) == [CONFUSION]
    table = arrays[CONFUSION]
    assert table["clients"].tolist() == [0]
    assert table["before"][0].tolist() == [[4, 1], [1, 4]] and table["after_stage2"][0].tolist() == [[5, 0], [0, 5]]
    assert all(table[f"reported_{point}"].tolist() == [True] for point in CONFUSION_POINTS)
    assert json.loads(json.dumps(monitor.results()))["confusion"] == {"file": CONFUSION, "clients": 1}


@pytest.mark.parametrize("half", [{"confusion_before": EYE}, {"confusion_after": EYE}])
def test_a_reply_with_one_of_the_two_confusion_matrices_records_none(half):
    monitor = FedCorrMonitor([0], sized({0: 10}))
    monitor.corrected({0: corrected(10, 1, 0, **half)}, "stage1")
    assert monitor.confusion == {} and monitor.arrays() == {}
    assert monitor.noise[0] == 0.0, "the counts themselves still count"


def test_the_split_is_the_latest_stage_1_one_and_a_reply_without_one_keeps_it():
    monitor = FedCorrMonitor([0], sized({0: 10}))
    monitor.corrected({0: corrected(10, 4, 2, split_tp=3, split_fp=1, split_fn=1, split_tn=5)}, "stage1")
    monitor.corrected({0: corrected(10, 2, 1, split_tp=2, split_fp=0, split_fn=0, split_tn=8)}, "stage1")
    monitor.corrected({0: corrected(10, 1, 0)}, "stage2")  # stage 2 splits nothing
    assert monitor.split == {0: dict(zip(SPLIT_KEYS, (2, 0, 0, 8), strict=True))}
    (row,) = monitor.client_rows()
    assert [row[key] for key in SPLIT_KEYS] == [2, 0, 0, 8]


def test_the_rows_name_every_column_of_fedcorr_clients_csv():
    monitor = FedCorrMonitor([0, 1], truth({0: 0.4, 1: 0.0}))
    monitor.corrected({0: corrected(100, 40, 10)}, "stage1")
    monitor.end_iteration(1, {0: 9.0, 1: 5.0}, {0: 9.0, 1: 5.0}, [0], {0: 0.4, 1: 0.0})
    monitor.clean_set([1])
    rows = monitor.client_rows()
    assert list(rows[0]) == ["client", "cumulative_lid", "detected_noisy", "mu_hat", "finetuned", "n", "n_known",
                             "true_noisy", "true_noise_before", "true_noise_estimated_on", "true_noise_after",
                             "mu_hat_error", "mu_hat_error_original", *SPLIT_KEYS]
    assert [row["cumulative_lid"] for row in rows] == [9.0, 5.0]
    assert [(row["detected_noisy"], row["finetuned"]) for row in rows] == [(True, False), (False, True)]
    assert [row["true_noisy"] for row in rows] == [True, False]
    assert rows[0]["n"] == 100 and rows[0]["n_known"] == 100 and rows[0]["mu_hat"] == 0.4
    fresh = FedCorrMonitor([0], truth({0: 0.4}))
    assert fresh.client_rows()[0]["mu_hat_error"] == pytest.approx(0.4), "no estimate yet counts as 0"
    assert fresh.results()["noise_estimate_mae_original"] == pytest.approx(0.4)
    blind = FedCorrMonitor([0], None)
    blind.end_iteration(1, {0: 2.0}, {0: 2.0}, [], {0: 0.0})
    assert blind.client_rows() == [{"client": 0, "cumulative_lid": 2.0, "detected_noisy": False, "mu_hat": 0.0,
                                    "finetuned": False}]


def test_each_iteration_and_stage_end_prints_one_line_with_its_figures(capsys):
    monitor = FedCorrMonitor([0, 1, 2], truth({0: 0.4, 1: 0.0, 2: 0.2}))
    monitor.corrected({0: corrected(100, 40, 10)}, "stage1")
    monitor.end_iteration(1, {0: 9.0, 1: 5.0, 2: 6.0}, {0: 9.0, 1: 5.0, 2: 6.0}, [0], {0: 0.4, 1: 0.0, 2: 0.0})
    monitor.end_stage("after_stage1")
    lines = capsys.readouterr().out.splitlines()
    # Detection: 1 hit of 1 flagged and 2 noisy. mu_hat MAE (0 + 0 + 0.2) / 3. Label noise (10 + 0 + 20) / 300.
    assert lines == [
        "[fedcorr] stage 1 iteration 1: 1 client detected noisy (precision 1.000, recall 0.500, F1 0.667); "
        "mu_hat MAE 0.0667; label noise 0.1000",
        "[fedcorr] label noise over all 300 samples after stage1: 0.1000",
    ]
    (record,) = monitor.iterations
    assert list(record) == ["iteration", "lid", "cumulative_lid", "detected_noisy_clients", "mu_hat",
                            "noise_estimate_mae", "noise_estimate_mae_original", "detection", "label_noise"]
    assert record["iteration"] == 1 and record["lid"] == {"0": 9.0, "1": 5.0, "2": 6.0}
    blind = FedCorrMonitor([0, 1], None)
    blind.end_iteration(2, {1: 1.0, 0: 2.0}, {1: 3.0, 0: 2.0}, [1, 0], {1: 0.1, 0: 0.2})
    blind.end_stage("after_stage2")
    assert capsys.readouterr().out.splitlines() == ["[fedcorr] stage 1 iteration 2: 2 clients detected noisy"]
    assert blind.iterations == [{"iteration": 2, "lid": {"0": 2.0, "1": 1.0}, "cumulative_lid": {"0": 2.0, "1": 3.0},
                                 "detected_noisy_clients": [0, 1], "mu_hat": {"0": 0.2, "1": 0.1}}]


def test_the_stage_end_line_is_left_out_when_the_label_noise_is_unknown(capsys):
    monitor = FedCorrMonitor([0], truth({0: 0.4}))
    monitor.corrected({0: CorrectRes(n_relabeled=3, mu_hat=0.4)}, "stage2")
    monitor.end_stage("after_stage2")
    assert capsys.readouterr().out == "" and monitor.label_noise["after_stage2"] is None
    (row,) = monitor.client_rows()
    assert row["true_noise_estimated_on"] is None and row["true_noise_after"] is None
    assert row["true_noise_before"] == 0.4, "the scene's figure before any correction is still known"
    assert np.isclose(monitor.label_noise["before"], 0.4)


def test_the_label_noise_weighs_clients_by_their_known_labels_and_skips_those_with_none():
    # Client 0: 1 known label, wrong; client 1: 3 known, right; client 2: no known label (rate NaN).
    ground = GroundTruth(noisy_clients=frozenset({0}), true_noise={0: 1.0, 1: 0.0, 2: float("nan")},
                         sizes={0: 1, 1: 3, 2: 4}, known={0: 1, 1: 3, 2: 0}, real_noise=True)
    monitor = FedCorrMonitor([0, 1, 2], ground)
    assert monitor.label_noise["before"] == pytest.approx(0.25), "1 wrong of 4 known"
    monitor.end_iteration(1, {0: 9.0, 1: 5.0, 2: 5.0}, {0: 9.0, 1: 5.0, 2: 5.0}, [0], {0: 0.9, 1: 0.0, 2: 0.2})
    rows = {row["client"]: row for row in monitor.client_rows()}
    assert rows[2]["mu_hat_error"] is None and rows[2]["mu_hat_error_original"] is None
    assert rows[0]["mu_hat_error_original"] == pytest.approx(0.1)
