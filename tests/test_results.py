import csv
import json

import numpy as np
import pytest

from server.results import ResultsWriter, read_payload, read_results, summarise


def add(writer: ResultsWriter, r: int, acc: float | None, loss: float | None = 0.5) -> dict:
    return writer.add_round(server_round=r, stage="fedavg", clients=[r, r + 1], comm_cost=2 * r,
                            test_acc=acc, test_loss=loss, train_loss=float("nan"))


def test_results_are_valid_after_every_round_and_complete_at_the_end(tmp_path):
    writer = ResultsWriter(tmp_path / "run", {"seed": 1})
    payload = json.loads((tmp_path / "run" / "results.json").read_text())
    # Until the run finishes, results.json stays small: no rounds, which are in rounds.jsonl.
    assert payload["complete"] is False and "rounds" not in payload and payload["config"] == {"seed": 1}
    assert read_payload(tmp_path / "run")["rounds"] == []
    add(writer, 1, 0.5)
    add(writer, 2, None, None)  # a round without central evaluation
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["complete"] is False and "rounds" not in written
    assert written["summary"]["comm_cost"] == 4 and written["summary"]["best_acc"] == 0.5
    lines = (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2]
    partial = read_payload(tmp_path / "run")
    assert [r["round"] for r in partial["rounds"]] == [1, 2] and partial["complete"] is False
    assert partial["rounds"][1]["test_acc"] is None and partial["rounds"][0]["train_loss"] is None
    with pytest.raises(RuntimeError, match="did not complete"):
        read_results(tmp_path / "run")
    add(writer, 3, 0.7)
    writer.finish(extra_block={"x": 1})
    final = read_results(tmp_path / "run")
    assert final["complete"] is True and final["extra_block"] == {"x": 1}
    # Complete: results.json itself holds every round.
    complete = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [r["round"] for r in complete["rounds"]] == [1, 2, 3] and complete["rounds"] == final["rounds"]
    assert final["summary"]["best_acc"] == 0.7 and final["summary"]["comm_cost"] == 6
    rows = list(csv.DictReader(open(tmp_path / "run" / "rounds.csv")))
    assert [row["round"] for row in rows] == ["1", "2", "3"]
    assert rows[0]["clients"] == "1 2" and rows[1]["test_acc"] == ""


def test_summary_uses_evaluated_rounds_only():
    rounds = [{"round": r, "test_acc": a, "comm_cost": c}
              for r, (a, c) in enumerate([(0.1, 1), (None, 2)] + [(0.1 * i, i + 2) for i in range(1, 12)], 1)]
    summary = summarise(rounds, wall_s=12.3456)
    assert summary["best_acc"] == pytest.approx(1.1) and summary["final_acc"] == pytest.approx(1.1)
    assert summary["best_round"] == 13
    assert summary["last10_mean_acc"] == pytest.approx(sum(0.1 * i for i in range(2, 12)) / 10)
    assert summary["comm_cost"] == 13 and summary["wall_s"] == 12.346
    assert summarise([], 0.0)["best_acc"] is None and summarise([], 0.0)["best_round"] is None


def test_the_best_round_is_the_first_to_reach_the_best_accuracy():
    """A later round that only equals the best does not move it; unevaluated rounds are skipped."""
    accuracies = [(1, 0.5), (2, 0.8), (3, None), (4, 0.8), (5, 0.6)]
    rounds = [{"round": r, "test_acc": a, "comm_cost": r} for r, a in accuracies]
    assert summarise(rounds, 1.0)["best_round"] == 2


def test_each_attempt_adds_its_provenance_after_those_of_the_attempts_before(tmp_path):
    """A fresh run starts the list; a run resumed from a checkpoint's state keeps the earlier attempts'
    records (none, from a checkpoint made before provenance was kept) and appends its own."""
    first = ResultsWriter(tmp_path / "run", {"seed": 1}, provenance={"attempt": 1})
    add(first, 1, 0.5)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["provenance"] == [{"attempt": 1}]
    resumed = ResultsWriter(tmp_path / "run", {"seed": 1}, first.state(), provenance={"attempt": 2})
    assert resumed.finish()["provenance"] == [{"attempt": 1}, {"attempt": 2}]
    old_state = {key: value for key, value in first.state().items() if key != "provenance"}
    from_old = ResultsWriter(tmp_path / "old", {"seed": 1}, old_state, provenance={"attempt": 2})
    assert from_old.finish()["provenance"] == [{"attempt": 2}]
    assert "provenance" not in ResultsWriter(tmp_path / "none", {"seed": 1}).finish()


def test_the_latest_evaluation_confusion_is_kept_and_unevaluated_rounds_leave_it(tmp_path):
    writer = ResultsWriter(tmp_path / "run", {"seed": 1})
    add(writer, 1, 0.5)
    assert "test_confusion" not in json.loads((tmp_path / "run" / "results.json").read_text())
    writer.add_round(server_round=2, stage="fedavg", clients=[1], comm_cost=1, test_acc=0.5, test_loss=0.1,
                     test_confusion=np.array([[3, 1], [2, 4]]))
    add(writer, 3, None, None)
    writer.add_round(server_round=4, stage="fedavg", clients=[1], comm_cost=1, test_acc=0.25, test_loss=0.1,
                     test_confusion=np.array([[0, 4], [2, 4]]))
    writer.add_round(server_round=5, stage="fedavg", clients=[1], comm_cost=1, test_acc=None, test_loss=None)
    final = writer.finish()
    assert final["test_confusion"] == {"round": 4, "rows": "true class", "columns": "predicted class",
                                       "counts": [[0, 4], [2, 4]]}
    assert read_results(tmp_path / "run")["test_confusion"]["counts"] == [[0, 4], [2, 4]]


def test_the_confusion_file_round_trips_the_points_each_client_reported_and_replaces_nothing_else(tmp_path):
    from common.atomic_files import read_npz
    from common.run_files import CONFUSION, confusion_arrays, read_confusion

    per_client = {7: {"before": [3, 1, 0, 4], "after_stage2": [4, 0, 0, 4]},
                  2: {"before": [2, 2, 1, 3], "after_stage1": [4, 0, 0, 4], "after_stage2": [4, 0, 1, 3]}}
    writer = ResultsWriter(tmp_path / "run", {"seed": 1})
    writer.write_arrays({CONFUSION: confusion_arrays(per_client)})
    arrays = read_npz(tmp_path / "run" / CONFUSION)
    assert arrays["clients"].tolist() == [2, 7] and arrays["before"].shape == (2, 2, 2)
    assert arrays["reported_after_stage1"].tolist() == [True, False]
    assert arrays["after_stage1"][1].tolist() == [[3, 1], [0, 4]], "not corrected in stage 1: the counts before"
    assert read_confusion(tmp_path / "run") == {str(pid): matrices for pid, matrices in per_client.items()}
    with pytest.raises(ValueError, match="different sizes"):
        confusion_arrays({1: {"before": [1, 2, 3, 4]}, 2: {"before": list(range(9))}})
    with pytest.raises(ValueError, match="'before' among them"):
        confusion_arrays({1: {"after_stage1": [1, 2, 3, 4]}})
    with pytest.raises(ValueError, match="not results files"):
        writer.write_arrays({"other.npz": {}})
    # A run that ends without counts leaves no file, and a fresh writer removes an earlier run's.
    writer.write_arrays({})
    assert read_confusion(tmp_path / "run") == {}
    writer.write_arrays({CONFUSION: confusion_arrays(per_client)})
    ResultsWriter(tmp_path / "run", {"seed": 1})
    assert not (tmp_path / "run" / CONFUSION).exists()


def test_the_header_says_what_runs_and_where_it_writes():
    """One line before the first round: method, dataset, clients, partition, noise with its parameters,
    seed and the run's folder."""
    from server.progress import header
    from settings.compose import compose_config
    from settings.run import run_settings

    settings = run_settings(compose_config(["experiment=smoke", "num_clients=1", "seed=4", "out_dir=outputs/x"]))
    line = header(settings, "fednoro")
    noise = settings.scene.noise
    assert line.startswith(f"[run] fednoro on {settings.scene.dataset.name}: 1 client, partition ")
    assert f"noise {noise.name} (" in line and all(f"{key}={value}" in line for key, value in noise.params.items()
                                                    if value is not None)
    assert line.endswith(", seed 4 -> outputs/x") and "\n" not in line
