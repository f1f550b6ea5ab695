"""TensorBoard live curves (logging.tensorboard=true): what a run writes while it goes, read back."""

from __future__ import annotations

import importlib.util

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.errors import ConfigError
from server.config import load_run
from server.live_curves import TENSORBOARD_DIR
from settings.compose import compose_config

SMALL = "experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=2 strategy.t2=2 strategy.t3=2"


def test_a_run_logs_its_rounds_and_fedcorrs_iterations(run_inprocess, tmp_path):
    payload, _ = run_inprocess(f"{SMALL} logging.tensorboard=true out_dir={tmp_path / 'run'}")
    events = EventAccumulator(str(tmp_path / "run" / TENSORBOARD_DIR))
    events.Reload()
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
    f1 = events.Scalars("fedcorr/detection_f1")
    assert [e.step for e in f1] == [it["iteration"] for it in iterations] == [1, 2]
    assert [e.value for e in f1] == pytest.approx([it["detection"]["f1"] for it in iterations])
    assert [e.value for e in events.Scalars("fedcorr/label_noise")] == pytest.approx(
        [it["label_noise"] for it in iterations])


def test_off_by_default_and_refused_without_the_package(tmp_path, monkeypatch):
    plan = load_run(compose_config(["experiment=smoke", f"out_dir={tmp_path}"]))
    assert plan.settings.logging.tensorboard is False
    with pytest.raises(ConfigError, match="logging.tensorboard='maybe' is invalid: allowed is true or false"):
        load_run(compose_config(["experiment=smoke", "logging.tensorboard=maybe"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.tensorboard=True is invalid: true needs the tensorboard package"):
        load_run(compose_config(["experiment=smoke", "logging.tensorboard=true"]))
