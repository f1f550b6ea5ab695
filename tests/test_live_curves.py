"""TensorBoard live curves (logging.tensorboard=true): what a run writes while it goes, read back
(MLflow's: test_mlflow_sink.py)."""

from __future__ import annotations

import importlib.util
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from common.errors import ConfigError
from server.config import load_run
from server.live_curves import LiveCurves, ResumePoint, flat_hparams
from server.tensorboard_sink import TENSORBOARD_DIR, TensorBoardSink
from settings.compose import compose_config

SMALL = "experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=2 strategy.t2=2 strategy.t3=2"


def _events(folder, axis_dir: str = "") -> EventAccumulator:
    events = EventAccumulator(str(folder / TENSORBOARD_DIR / axis_dir))
    events.Reload()
    return events


def test_a_run_logs_its_rounds_and_fedcorrs_iterations(run_inprocess, tmp_path):
    payload, _ = run_inprocess(f"{SMALL} logging.tensorboard=true out_dir={tmp_path / 'run'}")
    events = _events(tmp_path / "run")
    accuracy = events.Scalars("test/accuracy")
    rounds = payload["rounds"]
    evaluated = [r for r in rounds if r["test_acc"] is not None]  # stage 1: each iteration's end
    assert [e.step for e in accuracy] == [r["round"] for r in evaluated]
    assert [e.value for e in accuracy] == pytest.approx([r["test_acc"] for r in evaluated])
    stages = [e.value for e in events.Scalars("run/stage")]
    expected = [["preprocess", "finetune", "usual"].index(r["stage"]) for r in rounds]
    assert stages == expected
    assert [e.value for e in events.Scalars("run/comm_cost")] == [r["comm_cost"] for r in rounds]
    iterations = payload["fedcorr"]["iterations"]
    by_iteration = _events(tmp_path / "run", "iterations")  # an axis of its own: a resume purges it at its own step
    f1 = by_iteration.Scalars("fedcorr/detection_f1")
    assert [e.step for e in f1] == [it["iteration"] for it in iterations] == [1, 2]
    assert [e.value for e in f1] == pytest.approx([it["detection"]["f1"] for it in iterations])
    assert [e.value for e in by_iteration.Scalars("fedcorr/label_noise")] == pytest.approx(
        [it["label_noise"] for it in iterations])
    assert [e.value for e in by_iteration.Scalars("fedcorr/flagged_clients")] == [
        len(it["detected_noisy_clients"]) for it in iterations]


def test_off_by_default_and_refused_without_the_package(tmp_path, monkeypatch):
    plan = load_run(compose_config(["experiment=smoke", f"out_dir={tmp_path}"]))
    assert plan.settings.logging.tensorboard is False
    with pytest.raises(ConfigError, match="logging.tensorboard='maybe' is invalid: allowed is true or false"):
        load_run(compose_config(["experiment=smoke", "logging.tensorboard=maybe"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.tensorboard=True is invalid: true needs the tensorboard package"):
        load_run(compose_config(["experiment=smoke", "logging.tensorboard=true"]))


def test_every_methods_detection_the_config_and_the_cost_axis_are_logged(run_inprocess, tmp_path, capsys):
    """FedNoRo's detection (not only FedCorr's) as it changes, the resolved config as hyper-parameters
    and text, accuracy over communication cost, and a line saying where the events are."""
    out = tmp_path / "run"
    payload, _ = run_inprocess(f"experiment=smoke strategy=fednoro strategy.train.epochs=1 logging.tensorboard=true "
                               f"out_dir={out}")
    assert f"[tensorboard] events in {out / TENSORBOARD_DIR}: tensorboard --logdir" in capsys.readouterr().out
    events = _events(out)
    detection = payload["fednoro"]["detection"]
    flagged = events.Scalars("fednoro/detected/flagged_clients")
    # Logged once, at the detection: nothing before it (the warm-up flags no one), no change after it.
    assert [e.value for e in flagged] == [len(payload["fednoro"]["detected_noisy_clients"])]
    # The detection runs after the warm-up's last round, before the next one trains: it shows in that round.
    assert flagged[0].step == payload["fednoro"]["detections"][0]["after_round"] + 1
    assert [e.value for e in events.Scalars("fednoro/detected/f1")] == pytest.approx([detection["f1"]])
    evaluated = [r for r in payload["rounds"] if r["test_acc"] is not None]
    by_cost = _events(out, "by_comm_cost").Scalars("by_comm_cost/test/accuracy")
    assert [e.step for e in by_cost] == [r["comm_cost"] for r in evaluated]
    assert [e.value for e in by_cost] == pytest.approx([r["test_acc"] for r in evaluated])
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"name": "fednoro"' in text and f'"out_dir": "{out}"' in text, "the resolved config as text"
    # The HParams tab's experiment, in the run's own folder: every config key, compared on test/accuracy.
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    assert {"strategy.name", "seed", "noise.rho"} <= {h.name for h in experiment.hparam_infos}
    assert [m.name.tag for m in experiment.metric_infos] == ["test/accuracy"]


def _stage(server_round: int) -> str:
    return "warmup" if server_round <= 2 else "main"


def _write(folder, rounds: range, value: float, resume: ResumePoint | None, iterations: int = 0) -> None:
    """Log ``rounds`` (comm cost 3 per round; stage warmup up to round 2, then main) and FedCorr iterations
    1..``iterations`` as one attempt would."""
    blocks = {"fedcorr": {"iterations": [{"iteration": i, "label_noise": value} for i in range(1, iterations + 1)]}}
    live = LiveCurves(lambda: blocks, [TensorBoardSink(str(folder), {"seed": 1}, resume)],
                      resume.iteration - 1 if resume else 0, [_stage(r) for r in range(1, rounds.start)])
    for r in rounds:
        live.round({"round": r, "stage": _stage(r), "test_acc": value, "comm_cost": 3 * r})
    live.close(True)


def _points(folder, tag: str, axis_dir: str = "") -> list[tuple[int, float]]:
    return [(e.step, round(e.value, 6)) for e in _events(folder, axis_dir).Scalars(tag)]


def test_a_rerun_replaces_the_curves_and_a_resume_drops_what_a_killed_attempt_wrote_after_its_checkpoint(
        tmp_path, monkeypatch):
    """Fresh: only this run's events. Resumed after round 2: the killed attempt's rounds 3 and 4 are
    purged on every axis, each at its own step, so each step holds one value and nothing before the
    checkpoint is lost (the cost axis's steps are far above the rounds')."""
    # TensorBoard reads a folder's event files in the order of their names, which start with the second
    # they were made in: a resumed attempt is a later process, here a later second.
    real, seconds = time.time, [0]
    monkeypatch.setattr(time, "time", lambda: real() + seconds[0])

    def attempt(*args, **kwargs) -> None:
        _write(*args, **kwargs)
        seconds[0] += 10

    attempt(tmp_path, range(1, 5), 0.5, None)
    attempt(tmp_path, range(1, 3), 0.6, None)  # a fresh run in the same folder
    assert _points(tmp_path, "test/accuracy") == [(1, 0.6), (2, 0.6)]
    attempt(tmp_path, range(1, 5), 0.5, None, iterations=2)
    attempt(tmp_path, range(3, 6), 0.7, ResumePoint(round=3, comm_cost=7, iteration=2), iterations=2)
    assert _points(tmp_path, "test/accuracy") == [(1, 0.5), (2, 0.5), (3, 0.7), (4, 0.7), (5, 0.7)]
    assert _points(tmp_path, "by_comm_cost/test/accuracy", "by_comm_cost") == [
        (3, 0.5), (6, 0.5), (9, 0.7), (12, 0.7), (15, 0.7)]
    # Iteration 1 closed before the checkpoint and is kept; iteration 2 closed after it and is logged again.
    assert _points(tmp_path, "fedcorr/label_noise", "iterations") == [(1, 0.5), (2, 0.7)]
    # The resumed attempt numbers its stage as the killed one did: main is the second stage.
    assert _points(tmp_path, "run/stage") == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]


def test_the_config_flattens_into_hyper_parameters():
    assert flat_hparams({"seed": 1, "strategy": {"name": "fedavg", "lr": 0.1, "mu": None, "keys": [1, 2]},
                         "resume": False}) == {"seed": 1, "strategy.name": "fedavg", "strategy.lr": 0.1,
                                               "strategy.mu": "null", "strategy.keys": "[1, 2]", "resume": False}
