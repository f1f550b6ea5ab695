"""MLflow live curves (logging.mlflow=true): what a run logs to a real SQLite tracking store, read back
with MLflow's own client."""

from __future__ import annotations

import importlib.util
import json

import pytest
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

from common.errors import ConfigError
from server.config import load_run
from server.live_curves import LiveCurves, ResumePoint
from server.mlflow_sink import RUN_RECORD, MlflowSink, store_uri
from settings.compose import compose_config


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(point.step, round(point.value, 6)) for point in client.get_metric_history(run_id, key)]


def test_a_run_logs_its_config_rounds_detection_and_cost_axis(run_inprocess, tmp_path, capsys):
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    payload, _ = run_inprocess(f"experiment=smoke strategy=fednoro strategy.train.epochs=1 logging.mlflow=true "
                               f"logging.mlflow_uri={uri} out_dir={out}")
    record = json.loads((out / RUN_RECORD).read_text())
    assert record["tracking_uri"] == uri
    assert f"[mlflow] run {record['run_id']} in experiment 'digits' at {uri}" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
    assert client.get_experiment(run.info.experiment_id).name == "digits"  # the dataset's name by default
    assert run.data.tags["out_dir"] == str(out) and run.data.tags["strategy"] == "fednoro"
    params = run.data.params
    assert params["strategy.name"] == "fednoro" and params["seed"] == "1" and params["out_dir"] == str(out)
    evaluated = [r for r in payload["rounds"] if r["test_acc"] is not None]
    assert _history(client, run.info.run_id, "test/accuracy") == [
        (r["round"], round(r["test_acc"], 6)) for r in evaluated]
    assert _history(client, run.info.run_id, "by_comm_cost/test/accuracy") == [
        (r["comm_cost"], round(r["test_acc"], 6)) for r in evaluated]
    detection = payload["fednoro"]["detection"]
    assert _history(client, run.info.run_id, "fednoro/detected/f1") == [
        (payload["fednoro"]["detections"][0]["after_round"] + 1, round(detection["f1"], 6))]


def _attempt(folder, uri: str, rounds: range, value: float, resume: ResumePoint | None, iterations: int = 0,
             finished: bool = True) -> str:
    """Log ``rounds`` (comm cost 3 per round) and FedCorr iterations 1..``iterations`` as one attempt
    would; returns its MLflow run id."""
    blocks = {"fedcorr": {"iterations": [{"iteration": i, "label_noise": value} for i in range(1, iterations + 1)]}}
    sink = MlflowSink(str(folder), {"seed": 1, "strategy": {"name": "fedavg"}}, uri, "tests", resume)
    live = LiveCurves(lambda: blocks, [sink], resume.iteration - 1 if resume else 0)
    for r in rounds:
        live.round({"round": r, "stage": "fedavg", "test_acc": value, "comm_cost": 3 * r})
    live.close(finished)
    return sink.run_id


def test_a_rerun_replaces_the_run_and_a_resume_keeps_one_stream(tmp_path):
    """MLflow cannot drop points: a rerun deletes the folder's earlier MLflow run; a resume after round 2
    copies what was logged before the checkpoint, on every axis, into a new run and deletes the killed
    attempt's, whose rounds 3 and 4 are not copied."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    first = _attempt(tmp_path, uri, range(1, 5), 0.5, None)
    second = _attempt(tmp_path, uri, range(1, 3), 0.6, None)  # a fresh run in the same folder
    assert client.get_run(first).info.lifecycle_stage == "deleted"
    assert _history(client, second, "test/accuracy") == [(1, 0.6), (2, 0.6)]
    killed = _attempt(tmp_path, uri, range(1, 5), 0.5, None, iterations=2, finished=False)
    assert client.get_run(killed).info.status == RunStatus.to_string(RunStatus.FAILED)
    resumed = _attempt(tmp_path, uri, range(3, 6), 0.7, ResumePoint(round=3, comm_cost=7, iteration=2),
                       iterations=2)
    assert client.get_run(killed).info.lifecycle_stage == "deleted"
    assert json.loads((tmp_path / RUN_RECORD).read_text())["run_id"] == resumed
    assert _history(client, resumed, "test/accuracy") == [(1, 0.5), (2, 0.5), (3, 0.7), (4, 0.7), (5, 0.7)]
    assert _history(client, resumed, "by_comm_cost/test/accuracy") == [
        (3, 0.5), (6, 0.5), (9, 0.7), (12, 0.7), (15, 0.7)]
    # Iteration 1 closed before the checkpoint and is kept; iteration 2 closed after it and is logged again.
    assert _history(client, resumed, "fedcorr/label_noise") == [(1, 0.5), (2, 0.7)]
    active = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert [run.info.run_id for run in active] == [resumed]


def test_a_relative_sqlite_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert store_uri("sqlite:///outputs/mlflow.db") == f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    assert store_uri("http://tracking:5000") == "http://tracking:5000"


def test_off_by_default_bad_stores_refused_and_refused_without_the_package(tmp_path, monkeypatch):
    plan = load_run(compose_config(["experiment=smoke", f"out_dir={tmp_path}"]))
    assert plan.settings.logging.mlflow is False
    assert plan.settings.logging.mlflow_experiment == plan.settings.scene.dataset.name
    with pytest.raises(ConfigError, match="logging.mlflow_uri='outputs/mlflow.db' is invalid: allowed is an MLflow "
                                          "tracking URI: sqlite:///<file>"):
        load_run(compose_config(["experiment=smoke", "logging.mlflow_uri=outputs/mlflow.db"]))
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"logging.mlflow_uri='file:mlruns' is invalid: allowed is an sqlite:/// or "
                                          r"http\(s\):// store \(MLflow refuses its old file store unless "
                                          r"MLFLOW_ALLOW_FILE_STORE=true\)"):
        load_run(compose_config(["experiment=smoke", "logging.mlflow=true", "logging.mlflow_uri=file:mlruns"]))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert load_run(compose_config(["experiment=smoke", "logging.mlflow=true",
                                    "logging.mlflow_uri=file:mlruns"])).settings.logging.mlflow_uri == "file:mlruns"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.mlflow=True is invalid: true needs the mlflow package"):
        load_run(compose_config(["experiment=smoke", "logging.mlflow=true"]))
