"""report.py on real smoke run directories: figures drawn with the expected series, tables equal to
the results they summarise, multirun folders, unfinished runs and bad input."""

from __future__ import annotations

import csv
import json

import pytest

import report
from reports.document import write_report
from reports.figures import (
    STAGE_MATRICES,
    confusion_figure,
    curves_figure,
    lid_figure,
    noise_estimate_figure,
    split_figure,
    stage_confusions,
    stage_spans,
)
from reports.runs import MULTIRUN_INDEX, find_runs
from reports.tables import first_reach, group_runs, table_rows
from server.results import summarise

FEDCORR = "experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=2 strategy.t2=2 strategy.t3=2"
FEDAVG = "experiment=smoke strategy=fedavg strategy.num_rounds=4 strategy.train.epochs=1"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    """Three finished smoke runs: FedCorr, and FedAvg with seeds 1 and 2."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture
def smoke_runs(run_inprocess, runs_dir):
    for name, overrides in (("fedcorr", FEDCORR), ("fedavg-s1", f"{FEDAVG} seed=1"),
                            ("fedavg-s2", f"{FEDAVG} seed=2")):
        if not (runs_dir / name / "results.json").is_file():
            run_inprocess(f"{overrides} out_dir={runs_dir / name}")
    return runs_dir


def test_groups_and_tables_equal_the_results_they_summarise(smoke_runs):
    runs = find_runs([str(smoke_runs)])
    groups = group_runs(runs)
    assert sorted(len(members) for members in groups.values()) == [1, 2]
    fedavg = next(members for members in groups.values() if members[0].strategy == "fedavg")
    assert sorted(run.seed for run in fedavg) == [1, 2]
    rows = {row["group"]: row for row in table_rows(groups, target=0.5)}
    fedcorr_run = next(run for run in runs if run.strategy == "fedcorr")
    row = rows[next(label for label, members in groups.items() if members == [fedcorr_run])]
    summary, block = fedcorr_run.payload["summary"], fedcorr_run.fedcorr
    assert row["best %"] == f"{100 * summary['best_acc']:.2f}"
    assert row["detection F1"] == f"{block['detection']['f1']:.3f}"
    assert row["label noise after s2 %"] == f"{100 * block['label_noise']['after_stage2']:.2f}"
    reach = first_reach(fedcorr_run, 0.5)
    first = next(r for r in fedcorr_run.rounds if r["test_acc"] is not None and r["test_acc"] >= 0.5)
    assert (reach.round, reach.comm_cost) == (first["round"], first["comm_cost"])
    assert row["comm vs FedCorr"] == "1.00"
    # Two seeds: mean ± sample std of their best accuracies.
    bests = sorted(100 * run.payload["summary"]["best_acc"] for run in fedavg)
    fedavg_row = rows[next(label for label, members in groups.items() if members == fedavg)]
    mean, std = (bests[0] + bests[1]) / 2, abs(bests[1] - bests[0]) / 2 ** 0.5
    assert fedavg_row["best %"] == f"{mean:.2f} ± {std:.2f}"


def test_figures_have_the_expected_series(smoke_runs):
    runs = find_runs([str(smoke_runs)])
    groups = group_runs(runs)
    curves = curves_figure(groups)
    accuracy, loss = curves.axes
    assert len(accuracy.lines) == len(loss.lines) == len(groups)
    assert len(accuracy.collections) == 1, "one ± std band: the two-seed group"
    assert accuracy.get_xlabel() == "communication round" and "%" in accuracy.get_ylabel()
    fedcorr_run = next(run for run in runs if run.strategy == "fedcorr")
    assert len(accuracy.patches) == len(stage_spans(fedcorr_run.rounds)) == 3, "the three stages shaded"
    lid = lid_figure(fedcorr_run)
    assert lid is not None and len(lid.axes) == 2 * len(fedcorr_run.fedcorr["iterations"])
    cumulative = lid.axes[1]
    assert len(cumulative.containers) == 2, "clean and noisy histograms"
    counted = sum(patch.get_height() for container in cumulative.containers for patch in container)
    assert counted == len(fedcorr_run.fedcorr["clients"]), "every client in one of the two histograms"
    assert any(line.get_label() == "GMM split" for line in cumulative.lines)
    noise = noise_estimate_figure(fedcorr_run)
    assert noise is not None
    points = sum(len(collection.get_offsets()) for collection in noise.axes[0].collections)
    assert points == len(fedcorr_run.fedcorr["clients"])
    assert lid_figure(next(run for run in runs if run.strategy == "fedavg")) is None


def test_confusion_and_split_figures_count_every_known_sample(smoke_runs):
    run = next(run for run in find_runs([str(smoke_runs)]) if run.strategy == "fedcorr")
    block, rows = run.confusion, {row["client"]: row for row in run.fedcorr["clients"]}
    assert block, "the corrected clients reported their confusion counts (confusion.npz)"
    assert run.fedcorr["confusion"] == {"file": "confusion.npz", "clients": len(block)}
    for pid, matrices in block.items():
        for key, _ in STAGE_MATRICES:
            assert int(stage_confusions(matrices)[key].sum()) == rows[int(pid)]["n_known"]
    figure = confusion_figure(run)
    assert figure is not None
    panels = [axes for axes in figure.axes if axes.get_label() != "<colorbar>"]
    assert [axes.get_xlabel() for axes in panels] == ["label held"] * 3 and len(figure.axes) == 4
    assert len(panels[0].images) == 1 and panels[0].images[0].get_array().shape == (10, 10)
    one = int(next(iter(block)))
    assert confusion_figure(run, [one]) is not None and confusion_figure(run, [10_000]) is None
    split = split_figure(run)
    assert split is not None
    bars = split.axes[0].containers
    splitters = [row for row in rows.values() if row["split_tp"] is not None]
    assert len(bars) == 4 and all(len(container) == len(splitters) for container in bars)
    heights = [sum(container[i].get_height() for container in bars) for i in range(len(splitters))]
    assert heights == [row["n_known"] for row in splitters]


def test_report_writes_every_file_and_a_table_per_dataset(smoke_runs, tmp_path):
    assert report.main([str(smoke_runs), "--out", str(tmp_path / "report"), "--target", "0.5"]) == 0
    out = tmp_path / "report"
    text = (out / "report.md").read_text()
    pictures = [line.split("(")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(pictures) >= 4 and all((out / name).stat().st_size > 5000 for name in pictures)
    with open(out / "table-digits.csv") as stream:
        assert len(list(csv.DictReader(stream))) == 2


def test_multirun_folders_and_unfinished_runs(smoke_runs, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / MULTIRUN_INDEX).write_text(f"{smoke_runs / 'fedavg-s1'}\n{smoke_runs / 'fedavg-s2'}\n")
    assert [run.seed for run in find_runs([str(sweep)])] == [1, 2]
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    # What results.json holds after two rounds of a run that stopped: its rounds and their summary.
    payload = json.loads((smoke_runs / "fedavg-s1" / "results.json").read_text())
    payload.update(complete=False, rounds=payload["rounds"][:2], summary=summarise(payload["rounds"][:2], 1.0))
    (unfinished / "results.json").write_text(json.dumps(payload))
    report_md = write_report(find_runs([str(unfinished)]), tmp_path / "out", 0.5)
    assert "unfinished" in report_md.read_text()
    row = table_rows(group_runs(find_runs([str(unfinished)])), 0.5)[0]
    assert row["runs"] == "1 (1 unfinished)"
    best = max(r["test_acc"] for r in payload["rounds"] if r["test_acc"] is not None)
    assert row["best %"] == f"{100 * best:.2f}"


@pytest.mark.parametrize(("args", "message"), [
    (["{empty}"], "RUN_DIR='{empty}' is invalid: a run directory: no results.json"),
    (["{missing}"], "RUN_DIR='{missing}' is invalid: an existing run directory"),
    (["{runs}", "--target", "0"], "--target=0.0 is invalid: a fraction in (0, 1]"),
    (["{runs}", "--out", "{file}"], "--out='{file}' is invalid: a folder"),
    (["{listing}"], "is invalid: a run directory with results.json (listed in"),
])
def test_bad_input_is_one_line_and_exit_2(smoke_runs, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "listing").mkdir()
    (tmp_path / "listing" / MULTIRUN_INDEX).write_text(f"{tmp_path / 'gone'}\n")
    names = {"empty": tmp_path / "empty", "missing": tmp_path / "missing", "runs": smoke_runs,
             "file": tmp_path / "file", "listing": tmp_path / "listing"}
    argv = [arg.format(**names) for arg in args]
    assert report.main([*argv, "--out", str(tmp_path / "r")] if "--out" not in argv else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message.format(**names) in err[0]
    assert not (tmp_path / "r").exists(), "nothing written on bad input"


def test_the_detection_column_reads_the_block_of_the_runs_own_method(tmp_path):
    from reports.runs import Run

    def run(name: str, block: dict) -> Run:
        config = {"strategy": {"name": name}, "dataset": {"name": "digits"}, "seed": 1}
        return Run(tmp_path / name, {"config": config, "summary": {"best_acc": 0.9}, "rounds": [], name: block})

    rows = table_rows({"fednoro": [run("fednoro", {"detection": {"f1": 0.75}})],
                       "fedes": [run("fedes", {"detection": {"f1": 0.5}, "quality_mse": 0.02})],
                       "fedavg": [run("fedavg", {})]}, target=0.5)
    assert [row["detection F1"] for row in rows] == ["0.750", "0.500", "-"]
    assert all(row["label noise after s2 %"] == "-" for row in rows), "FedCorr's own figure"


def test_a_null_detection_is_left_out_of_the_mean_not_averaged_in_as_0(tmp_path):
    from reports.runs import Run

    def run(seed: int, block: dict) -> Run:
        config = {"strategy": {"name": "fedcorr"}, "dataset": {"name": "digits"}, "seed": seed}
        return Run(tmp_path / str(seed), {"config": config, "summary": {}, "rounds": [], "fedcorr": block})

    clean = {"detection": None, "detection_not_applicable": "no client of the scene is noisy ..."}
    rows = table_rows({"a": [run(1, {"detection": {"f1": 0.8}}), run(2, clean)], "b": [run(3, clean)]}, target=0.5)
    assert [row["detection F1"] for row in rows] == ["0.800", "-"]


def test_a_results_json_that_still_holds_the_confusion_counts_reads_as_before(tmp_path):
    from reports.runs import Run

    inline = {"3": {"before": [2, 1, 0, 3], "after_stage2": [3, 0, 0, 3]}}
    run = Run(tmp_path, {"config": {}, "rounds": [], "fedcorr": {"confusion": inline}})
    assert run.confusion == inline
    assert Run(tmp_path, {"config": {}, "rounds": [], "fedcorr": {"confusion": None}}).confusion == {}
