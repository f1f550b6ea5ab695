"""FedDiv's monitor (the ``feddiv`` block of results.json) on hand-written reports: the block with no
round yet, the first global filter's line, the filters' history, detection at the threshold, the
summed counts and scores, which clients count as not having sent their ground-truth counts, the
figures with zero denominators and the per-class shares over rounds."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict

import pytest
from test_feddiv import _report
from test_fedes import FlushedLines

from protocol.feddiv import Diagnostics, FedDivRes
from strategies.detection import missing_diagnostics
from strategies.feddiv import FedDivMonitor
from strategies.ground_truth import GroundTruth
from task.noise_filter import NoiseFilter

FILTER = NoiseFilter(0.2, 0.7, 0.01, 0.01, 0.6, 0.4)


def truth(known: dict[int, int], noise: float = 0.3) -> GroundTruth:
    """Every client with ``known`` samples is noisy at ``noise``; clients absent from ``known`` have no
    known true label."""
    return GroundTruth(noisy_clients=frozenset(known), true_noise=dict.fromkeys(known, noise),
                       sizes=dict.fromkeys(known, 10), known=dict(known))


def counts(known: int = 10, wrong: int = 0, relabeled_correct: int = 0, trained_wrong: int = 0,
           per_class: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = ((), (), ())) -> Diagnostics:
    """Ground-truth counts with a split that flags nothing (every wrong label kept clean)."""
    return Diagnostics(known=known, wrong=wrong, split_tp=0, split_fp=0, split_fn=wrong, split_tn=known - wrong,
                       relabeled_correct=relabeled_correct, trained_wrong=trained_wrong, class_known=per_class[0],
                       class_trained=per_class[1], class_trained_wrong=per_class[2])


def report(estimate: float = 0.3, relabeled: int = 0, trained: int = 10,
           diagnostics: Diagnostics | None = None) -> FedDivRes:
    return FedDivRes(filter=FILTER, noise_estimate=estimate, relabeled=relabeled, trained=trained,
                     diagnostics=diagnostics)


def test_before_any_main_round_the_block_has_no_filter_and_zero_counts():
    """A run that ends in the warm-up still writes the block: no filter (null, not an error), no
    history, no client seen, and counts of 0 (not null, not 1)."""
    assert FedDivMonitor([0, 1], 0.3, None).results() == {
        "global_filter": None, "global_filters": [], "noise_estimates": {}, "clients_seen": 0,
        "detected_noisy_clients": [], "relabeled": 0, "trained_samples": 0,
    }


def test_the_first_global_filter_is_printed_once_flushed_and_every_filter_is_kept_with_its_round(monkeypatch):
    """Only the first main round prints the filter (the line a user watches in a live log, flushed at
    once); the block's history holds each round's filter under ``round``, and the last is the global one."""
    stdout = FlushedLines()
    monkeypatch.setattr(sys, "stdout", stdout)
    later = NoiseFilter(0.1, 0.9, 0.02, 0.03, 0.8, 0.2)
    monitor = FedDivMonitor([0, 1], 0.3, None)
    monitor.round(3, {0: report()}, FILTER)
    line = "[feddiv] first global filter (round 3): clean N(0.200, 0.0100) x 0.600, noisy N(0.700, 0.0100) x 0.400\n"
    assert stdout.getvalue() == line and stdout.flushed[-1:] == [line], "one line, flushed at once"
    monitor.round(4, {1: report()}, later)
    assert stdout.getvalue() == line, "later rounds print nothing"
    block = monitor.results()
    assert block["global_filter"] == asdict(later)
    assert block["global_filters"] == [{"round": 3, **asdict(FILTER)}, {"round": 4, **asdict(later)}]


def test_a_client_at_the_threshold_is_detected_and_counts_sum_over_clients_and_rounds():
    """delta_hat >= the clean-client threshold is noisy (0.3 is, 0.29 is not); a client's latest estimate
    counts; relabelled and trained samples add up over reports and rounds (2 + 1 + 4, 10 + 7 + 8)."""
    monitor = FedDivMonitor([0, 1], 0.3, None)
    monitor.round(1, {0: report(0.1, relabeled=2, trained=10), 1: report(0.3, relabeled=1, trained=7)}, FILTER)
    monitor.round(2, {0: report(0.29, relabeled=4, trained=8)}, FILTER)
    block = monitor.results()
    assert block["detected_noisy_clients"] == [1]
    assert block["noise_estimates"] == {"0": 0.29, "1": 0.3} and block["clients_seen"] == 2
    assert block["relabeled"] == 7 and block["trained_samples"] == 25


def test_without_ground_truth_the_clients_counts_add_no_figure():
    """A server without the scene's truth reports no score even when a node sent counts."""
    monitor = FedDivMonitor([0], 0.3, None)
    monitor.round(1, {0: report(diagnostics=counts(wrong=3))}, FILTER)
    assert set(monitor.results()) == {"global_filter", "global_filters", "noise_estimates", "clients_seen",
                                      "detected_noisy_clients", "relabeled", "trained_samples"}


def test_with_ground_truth_the_block_scores_the_estimates_the_split_and_the_relabels():
    """Client 0: delta_hat 0.5 against a true 0.3, 4 wrong labels of 10 (none flagged), 3 of 4 relabels
    right, 2 of 8 trained labels wrong: MAE 0.2, split recall 0, relabel precision 3/4, given noise
    0.4, trained noise 0.25, and every 'not applicable' reason null."""
    monitor = FedDivMonitor([0], 0.3, truth({0: 10}))
    monitor.round(1, {0: report(0.5, relabeled=4, trained=8,
                                diagnostics=counts(wrong=4, relabeled_correct=3, trained_wrong=2))}, FILTER)
    block = monitor.results()
    assert block["noise_estimate_mae"] == pytest.approx(0.2)
    assert block["sample_split"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert block["sample_split_not_applicable"] is None
    assert block["relabel_precision"] == 0.75
    assert block["label_noise"] == {"given": 0.4, "trained": 0.25}
    assert block["label_noise_not_available"] is None


def test_label_noise_is_null_where_no_label_is_known_or_nothing_was_trained():
    """A client with no known true label that trained on nothing: both shares are 0/0, so null."""
    monitor = FedDivMonitor([0], 0.3, truth({0: 0}))
    monitor.round(1, {0: report(trained=0, diagnostics=counts(known=0))}, FILTER)
    block = monitor.results()
    assert block["label_noise"] == {"given": None, "trained": None} and block["relabel_precision"] is None


def test_per_class_shares_add_the_counts_of_every_round_and_are_null_where_a_class_has_none():
    """Two rounds of one client over three classes: known 4+4, 2+2, 0; trained 2+4, 0, 0; trained wrong
    1, 0, 0. Kept 6/8, 0/4, null (0/0); trained wrong 1/6, null, null. As results.json writes them."""
    monitor = FedDivMonitor([0], 0.3, truth({0: 10}))
    monitor.round(1, {0: report(diagnostics=counts(per_class=((4, 2, 0), (2, 0, 0), (1, 0, 0))))}, FILTER)
    monitor.round(2, {0: report(diagnostics=counts(per_class=((4, 2, 0), (4, 0, 0), (0, 0, 0))))}, FILTER)
    per_class = monitor.results()["per_class"]
    assert per_class == {"kept": [0.75, 0.0, None], "trained_wrong": [pytest.approx(1 / 6), None, None]}
    assert json.dumps(per_class["kept"]) == "[0.75, 0.0, null]", "a plain 0.0 (not -0.0, not NaN) in the JSON"


def test_only_clients_whose_true_labels_are_known_count_as_not_sending_counts():
    """None of the three clients sends counts; client 0 has 1 known true label, client 1 none and
    client 2 is not in the truth's table of known labels at all (read as none): only client 0 makes the
    figures null."""
    scene = GroundTruth(noisy_clients=frozenset({0}), true_noise={0: 0.3, 1: math.nan, 2: math.nan},
                        sizes=dict.fromkeys(range(3), 10), known={0: 1, 1: 0})
    monitor = FedDivMonitor([0, 1, 2], 0.3, scene)
    monitor.round(1, {pid: report() for pid in range(3)}, FILTER)
    block = monitor.results()
    assert block["label_noise_not_available"] == missing_diagnostics([0])


def test_where_counts_are_missing_every_figure_built_from_them_is_null_with_the_reason():
    """Client 1 sends no counts: the split, the per-class shares and the label noise are null, and the
    split says why as well (the estimates' MAE needs no counts and stays)."""
    monitor = FedDivMonitor([0, 1], 0.1, truth({0: 10, 1: 10}))
    monitor.round(1, {0: _report(3, 2, 1), 1: _report(3, 3, 0, diagnostics_sent=False)}, FILTER)
    block = monitor.results()
    reason = missing_diagnostics([1])
    assert block["sample_split"] is None and block["sample_split_not_applicable"] == reason
    assert block["per_class"] is None and block["label_noise_not_available"] == reason
    assert block["noise_estimate_mae"] == pytest.approx(0.0)
