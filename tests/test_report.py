"""report.py on real smoke run directories: figures drawn with the expected series, tables equal to
the results they summarise, multirun folders, unfinished runs and bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

import report
from data.plot import partition_figure
from reports.document import _noise_axis_in_percent, write_report
from reports.figures import (
    DOT,
    OKABE_ITO,
    POINT_AREA,
    STAGE_CHANGE,
    STAGE_MATRICES,
    choose_x,
    confusion_figure,
    curves_figure,
    lid_figure,
    noise_estimate_figure,
    split_figure,
    stage_confusions,
    stage_spans,
)
from reports.runs import MULTIRUN_INDEX, Run, find_runs
from reports.tables import first_reach, group_runs, markdown, table_rows
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
    assert row["detection F1"] == f"{100 * block['detection']['f1']:.1f}", "F1 in %, as every rate the report shows"
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
    assert len(accuracy.lines) - len(_stage_marks(accuracy)) == len(loss.lines) - len(_stage_marks(loss)) == len(groups)
    assert len(accuracy.collections) == 1, "one ± std band: the two-seed group"
    assert accuracy.get_xlabel() == "communication round" and "%" in accuracy.get_ylabel()
    fedcorr_run = next(run for run in runs if run.strategy == "fedcorr")
    assert len(stage_spans(fedcorr_run.rounds)) == 3
    assert not accuracy.patches, "FedCorr's stages are not FedAvg's: nothing shaded behind both"
    assert len(_stage_marks(accuracy)) == 2, "FedCorr's two stage changes, dotted"
    fedcorr_alone = curves_figure({"fedcorr": [fedcorr_run]})
    assert len(fedcorr_alone.axes[0].patches) == 3, "one run: its three stages shaded"
    lid = lid_figure(fedcorr_run)
    assert lid is not None and len(lid.axes) == 2 * len(fedcorr_run.fedcorr["iterations"])
    cumulative = lid.axes[1]
    assert len(cumulative.containers) == 2, "clean and noisy histograms"
    counted = sum(patch.get_height() for container in cumulative.containers for patch in container)
    assert counted == len(fedcorr_run.fedcorr["clients"]), "every client in one of the two histograms"
    assert any(line.get_label() == "GMM split" for line in cumulative.lines)
    noise = noise_estimate_figure(fedcorr_run)
    assert noise is not None
    for panel in noise.axes:
        clients = sum(collection.get_sizes().sum() / POINT_AREA for collection in panel.collections)
        assert clients == len(fedcorr_run.fedcorr["clients"]), "every client, coincident ones counted in the area"
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
    def run(name: str, block: dict) -> Run:
        config = {"strategy": {"name": name}, "dataset": {"name": "digits"}, "seed": 1}
        return Run(tmp_path / name, {"config": config, "summary": {"best_acc": 0.9}, "rounds": [], name: block})

    rows = table_rows({"fednoro": [run("fednoro", {"detection": {"f1": 0.75}})],
                       "fedes": [run("fedes", {"detection": {"f1": 0.5}, "quality_mse": 0.02})],
                       "fedavg": [run("fedavg", {})]}, target=0.5)
    assert [row["detection F1"] for row in rows] == ["75.0", "50.0", "-"]
    assert all(row["label noise after s2 %"] == "-" for row in rows), "FedCorr's own figure"


def test_a_null_detection_is_left_out_of_the_mean_not_averaged_in_as_0(tmp_path):
    def run(seed: int, block: dict) -> Run:
        config = {"strategy": {"name": "fedcorr"}, "dataset": {"name": "digits"}, "seed": seed}
        return Run(tmp_path / str(seed), {"config": config, "summary": {}, "rounds": [], "fedcorr": block})

    clean = {"detection": None, "detection_not_applicable": "no client of the scene is noisy ..."}
    rows = table_rows({"a": [run(1, {"detection": {"f1": 0.8}}), run(2, clean)], "b": [run(3, clean)]}, target=0.5)
    assert [row["detection F1"] for row in rows] == ["80.0", "-"]


def test_a_results_json_that_still_holds_the_confusion_counts_reads_as_before(tmp_path):
    inline = {"3": {"before": [2, 1, 0, 3], "after_stage2": [3, 0, 0, 3]}}
    run = Run(tmp_path, {"config": {}, "rounds": [], "fedcorr": {"confusion": inline}})
    assert run.confusion == inline
    assert Run(tmp_path, {"config": {}, "rounds": [], "fedcorr": {"confusion": None}}).confusion == {}


# In-memory runs for the figures' rules (no simulation): a run is its stages, each (name, rounds, cost per round).
FEDCORR_STAGES = (("preprocess", 4, 1), ("finetune", 2, 3), ("usual", 3, 3))
FEDAVG_STAGES = (("fedavg", 9, 3),)


def _rounds(stages: tuple[tuple[str, int, int], ...], accuracy: float = 0.5, loss: float = 1.0) -> list[dict]:
    """One row per round, the communication cost summed over the rounds so far."""
    rows, cost = [], 0
    for stage, count, per_round in stages:
        for _ in range(count):
            cost += per_round
            rows.append({"round": len(rows) + 1, "stage": stage, "test_acc": accuracy, "test_loss": loss,
                         "clients": list(range(per_round)), "comm_cost": cost})
    return rows


def _run(path: Path, strategy: str, stages: tuple[tuple[str, int, int], ...], seed: int = 1, **fields) -> Run:
    config = {"strategy": {"name": strategy}, "dataset": {"name": "digits"}, "seed": seed}
    return Run(path, {"config": config, "rounds": _rounds(stages, **fields), "summary": {}, "complete": True})


def _stage_marks(axes: Axes) -> list:
    """The per-method stage-change lines drawn on ``axes``."""
    return [line for line in axes.lines if line.get_gid() == STAGE_CHANGE]


def _titles(figure: Figure) -> list[str]:
    """Every title of a figure: its suptitle and each panel's."""
    return [figure.get_suptitle(), *(axes.get_title() for axes in figure.axes)]


def test_no_file_path_in_any_figure_title(tmp_path):
    where = tmp_path / "outputs" / "bench-x" / "seed1" / "fedcorr"
    fedcorr = _run(where, "fedcorr", FEDCORR_STAGES)
    fedcorr.payload["fedcorr"] = {"clients": [{"client": 0, "mu_hat": 0.2, "detected_noisy": True,
                                               "true_noise_estimated_on": 0.1, "true_noise_before": 0.4}]}
    fedavg = _run(where.parent / "fedavg", "fedavg", FEDAVG_STAGES)
    figures = [curves_figure({"fedcorr": [fedcorr], "fedavg": [fedavg]}), curves_figure({"fedcorr": [fedcorr]}),
               noise_estimate_figure(fedcorr, "fedcorr, seed 1")]
    for figure in figures:
        assert figure is not None
        assert not any(str(tmp_path) in title or "bench-x" in title for title in _titles(figure)), _titles(figure)
    assert figures[-1].get_suptitle().startswith("fedcorr, seed 1: "), "the group's label names the run"


def test_stages_are_shaded_only_when_every_run_has_the_same_ones(tmp_path):
    same = {"fedcorr": [_run(tmp_path / "a1", "fedcorr", FEDCORR_STAGES, seed=1),
                        _run(tmp_path / "a2", "fedcorr", FEDCORR_STAGES, seed=2)],
            "fedcorr stage3=poc": [_run(tmp_path / "b", "fedcorr", FEDCORR_STAGES)]}
    for x in ("round", "comm_cost"):
        figure = curves_figure(same, x)
        for axes in figure.axes:
            assert len(axes.patches) == 3 and not _stage_marks(axes), "the common stages shaded, nothing dotted"
        assert "shaded" in figure.get_suptitle()
    longer_t3 = (*FEDCORR_STAGES[:2], ("usual", 5, 3))
    for other in (_run(tmp_path / "c", "fedavg", FEDAVG_STAGES), _run(tmp_path / "d", "fedcorr", longer_t3)):
        figure = curves_figure({"fedcorr": same["fedcorr"], "other": [other]}, "round")
        assert all(not axes.patches for axes in figure.axes), "different stages: no one's shading behind all"
        assert "differ" in figure.get_suptitle()


def test_each_method_marks_its_own_stage_changes_in_its_colour_when_they_differ(tmp_path):
    fedes = (("pretrain", 3, 3), ("estimate", 1, 10), ("segd", 5, 3))
    groups = {"fedcorr": [_run(tmp_path / "a", "fedcorr", FEDCORR_STAGES)],
              "fedavg": [_run(tmp_path / "b", "fedavg", FEDAVG_STAGES)],
              "fedes": [_run(tmp_path / "c", "fedes", fedes)]}
    figure = curves_figure(groups, "comm_cost")
    expected = {  # halfway between a stage's last point and the next one's first, over communication cost
        OKABE_ITO[0]: [(4 + 7) / 2, (10 + 13) / 2],
        OKABE_ITO[2]: [(9 + 19) / 2, (19 + 22) / 2],
    }
    for axes in figure.axes:
        marks = _stage_marks(axes)
        drawn: dict[str, list[float]] = {}
        for line in marks:
            drawn.setdefault(line.get_color(), []).append(line.get_xdata()[0])
        assert {colour: sorted(xs) for colour, xs in drawn.items()} == expected, "FedAvg has no stage change"
        assert all(line.is_dashed() for line in marks)
        patterns = {line.get_color(): line._unscaled_dash_pattern for line in marks}  # matplotlib has no getter
        assert all(dashes[0] == DOT for _, dashes in patterns.values()), "dots"
        assert len({offset for offset, _ in patterns.values()}) == 2, "two methods' dots take turns, not overlap"
        assert {text.get_text().strip() for text in axes.texts} == {"finetune", "usual", "estimate", "segd"}
    legend = figure.legends[0]
    assert any("stage change" in text.get_text() for text in legend.get_texts())


def test_auto_axis_takes_communication_cost_when_the_round_structures_differ(tmp_path):
    fedcorr = [_run(tmp_path / "a", "fedcorr", FEDCORR_STAGES)]
    same = {"fedcorr": fedcorr, "fedcorr stage3=poc": [_run(tmp_path / "b", "fedcorr", FEDCORR_STAGES)]}
    differ = {"fedcorr": fedcorr, "fedavg": [_run(tmp_path / "c", "fedavg", FEDAVG_STAGES)]}
    dearer = {"fedavg": [_run(tmp_path / "d", "fedavg", FEDAVG_STAGES)],
              "fedavg fraction=0.2": [_run(tmp_path / "e", "fedavg", (("fedavg", 9, 6),))]}
    assert choose_x(same) == "round"
    assert choose_x(differ) == "comm_cost" and choose_x(dearer) == "comm_cost", "other stages, other cost per round"
    assert choose_x(differ, "round") == "round" and choose_x(same, "comm_cost") == "comm_cost", "as asked"
    assert curves_figure(differ, "auto").axes[0].get_xlabel().startswith("communication cost")
    assert curves_figure(same, "auto").axes[0].get_xlabel() == "communication round"


def test_report_defaults_to_auto_and_still_takes_round_and_comm_cost(tmp_path):
    folders = []
    for name, strategy, stages in (("fedcorr", "fedcorr", FEDCORR_STAGES), ("fedavg", "fedavg", FEDAVG_STAGES)):
        run = _run(tmp_path / "runs" / name, strategy, stages)
        run.path.mkdir(parents=True)
        (run.path / "results.json").write_text(json.dumps(run.payload))
        folders.append(str(run.path))
    for extra, axis in (([], "communication cost"), (["--x", "round"], "communication round"),
                        (["--x", "comm_cost"], "communication cost")):
        out = tmp_path / f"report{len(extra)}{'-'.join(extra)}"
        assert report.main([*folders, "--out", str(out), "--target", "0.5", *extra]) == 0
        text = (out / "report.md").read_text()
        assert f"Curves over {axis}" in text
        assert ("chosen as the runs' rounds differ" in text) is (not extra), "auto says why it chose"
        assert "target accuracy 50%" in text, "the target in %"


def test_a_std_band_stays_within_0_and_100_percent_and_a_loss_band_above_0(tmp_path):
    runs = [_run(tmp_path / "a", "fedavg", FEDAVG_STAGES, seed=1, accuracy=0.99, loss=0.02),
            _run(tmp_path / "b", "fedavg", FEDAVG_STAGES, seed=2, accuracy=0.60, loss=1.50)]
    accuracy, loss = curves_figure({"fedavg": runs}).axes

    def band(axes: Axes) -> np.ndarray:
        (collection,) = [c for c in axes.collections if isinstance(c, PolyCollection)]
        return np.concatenate([path.vertices[:, 1] for path in collection.get_paths()])

    acc_mean, acc_std = np.mean([99.0, 60.0]), np.std([99.0, 60.0], ddof=1)
    assert acc_mean + acc_std > 100, "unclipped, the band would pass 100%"
    assert band(accuracy).min() == pytest.approx(acc_mean - acc_std) and band(accuracy).max() == 100.0
    loss_mean, loss_std = np.mean([0.02, 1.50]), np.std([0.02, 1.50], ddof=1)
    assert loss_mean - loss_std < 0, "unclipped, the band would go below 0"
    assert band(loss).min() == 0.0 and band(loss).max() == pytest.approx(loss_mean + loss_std), "no upper limit"


def _clients(rows: list[tuple[float, float, float, bool]]) -> list[dict]:
    """FedCorr's clients rows: (noise it was estimated on, original noise, mu_hat, flagged)."""
    return [{"client": k, "true_noise_estimated_on": on, "true_noise_before": before, "mu_hat": mu,
             "detected_noisy": flagged} for k, (on, before, mu, flagged) in enumerate(rows)]


def _points(axes: Axes) -> list[tuple[float, float, float]]:
    """(x, y, clients) of every marker on a panel, clients read from its area."""
    return sorted((float(x), float(y), float(size) / POINT_AREA) for collection in axes.collections
                  for (x, y), size in zip(collection.get_offsets(), collection.get_sizes()))


def test_noise_figure_has_a_panel_per_true_noise_with_its_own_error(tmp_path):
    rows = [(0.10, 0.40, 0.20, True), (0.25, 0.50, 0.30, True), (0.0, 0.0, 0.0, False)]
    run = _run(tmp_path / "a", "fedcorr", FEDCORR_STAGES)
    run.payload["fedcorr"] = {"clients": _clients(rows), "noise_estimate_mae": 0.05,
                              "noise_estimate_mae_original": 0.1333}
    figure = noise_estimate_figure(run)
    assert figure is not None and len(figure.axes) == 2
    left, right = figure.axes
    assert _points(left) == sorted((100 * on, 100 * mu, 1.0) for on, _, mu, _ in rows)
    assert _points(right) == sorted((100 * before, 100 * mu, 1.0) for _, before, mu, _ in rows)
    assert "estimated on" in left.get_xlabel() and "estimated on" in left.get_title()
    assert "before any correction" in right.get_xlabel() and "original" in right.get_title()
    assert "MAE 5.0 percentage points" in left.get_title() and "MAE 13.3 percentage points" in right.get_title()
    del run.payload["fedcorr"]["noise_estimate_mae_original"]
    right = noise_estimate_figure(run).axes[1]
    assert "MAE" not in right.get_title() and _points(right), "no error known: the points all the same"


def test_coincident_clients_are_one_marker_with_an_area_per_client(tmp_path):
    rows = [(0.0, 0.0, 0.0, False)] * 5 + [(0.2, 0.6, 0.3, True)] * 2 + [(0.1, 0.5, 0.3, True)]
    run = _run(tmp_path / "a", "fedcorr", FEDCORR_STAGES)
    run.payload["fedcorr"] = {"clients": _clients(rows)}
    figure = noise_estimate_figure(run)
    assert figure is not None
    left, right = figure.axes
    assert _points(left) == [(0.0, 0.0, 5.0), (10.0, 30.0, 1.0), (20.0, 30.0, 2.0)]
    assert _points(right) == [(0.0, 0.0, 5.0), (50.0, 30.0, 1.0), (60.0, 30.0, 2.0)]
    for panel in (left, right):
        assert sorted(text.get_text() for text in panel.texts) == ["2", "5"], "the number beside each shared point"
        assert any("area" in text.get_text() for text in panel.get_legend().get_texts()), "the legend says so"
        assert panel.get_xlim()[0] < 0 and panel.get_ylim()[0] < 0, "markers at 0 drawn whole"


def test_the_tables_and_the_partition_show_rates_in_percent(tmp_path):
    block = {"detection": {"f1": 0.875}, "label_noise": {"after_stage2": 0.0725}}
    run = _run(tmp_path / "a", "fedcorr", FEDCORR_STAGES)
    run.payload.update(fedcorr=block, summary={"best_acc": 0.881, "final_acc": 0.88, "last10_mean_acc": 0.8789})
    rows = table_rows({"fedcorr": [run]}, target=0.5)
    header, _, line = markdown(rows).splitlines()
    assert "| detection F1 % |" in header and "| best % |" in header and "| label noise after s2 % |" in header
    assert "| 88.10 | 88.00 | 87.89 | 87.5 | 7.25 |" in line
    write_report([run], tmp_path / "out", 0.5)
    with open(tmp_path / "out" / "table-digits.csv") as stream:
        (written,) = list(csv.DictReader(stream))
    assert written["detection F1 %"] == "87.5" and written["best %"] == "88.10"
    figure = partition_figure(np.array([[3, 1], [2, 2]]), noise_rate=np.array([0.25, 0.5]))
    _noise_axis_in_percent(figure)
    noise = figure.axes[1]
    noise.figure.canvas.draw()
    assert "(%)" in noise.get_xlabel()
    assert all(label.get_text().endswith("%") for label in noise.get_xticklabels() if label.get_text())
