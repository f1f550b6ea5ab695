"""TensorBoard live curves (logging.tensorboard=true): what a run writes while it goes, read back."""

from __future__ import annotations

import importlib.util

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

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


def _events(folder) -> EventAccumulator:
    events = EventAccumulator(str(folder / TENSORBOARD_DIR))
    events.Reload()
    return events


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
    by_cost = events.Scalars("by_comm_cost/test/accuracy")
    assert [e.step for e in by_cost] == [r["comm_cost"] for r in evaluated]
    assert [e.value for e in by_cost] == pytest.approx([r["test_acc"] for r in evaluated])
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"name": "fednoro"' in text and f'"out_dir": "{out}"' in text, "the resolved config as text"
    # The HParams tab's experiment, in the run's own folder: every config key, compared on test/accuracy.
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    assert {"strategy.name", "seed", "noise.rho"} <= {h.name for h in experiment.hparam_infos}
    assert [m.name.tag for m in experiment.metric_infos] == ["test/accuracy"]


def test_a_rerun_replaces_the_curves_and_a_resume_drops_what_a_killed_attempt_wrote_after_its_checkpoint(tmp_path):
    """Fresh: only this run's events. Resumed at round 3: the killed attempt's rounds 3 and 4 are purged,
    so each step holds one value."""
    from server.live_curves import LiveCurves

    def write(rounds: range, value: float, first_round: int) -> None:
        live = LiveCurves(str(tmp_path), dict, {"seed": 1}, first_round)
        for r in rounds:
            live.round({"round": r, "stage": "fedavg", "test_acc": value, "comm_cost": 3 * r})
        live.close()

    write(range(1, 5), 0.5, 1)
    write(range(1, 3), 0.6, 1)  # a fresh run in the same folder
    assert [(e.step, round(e.value, 6)) for e in _events(tmp_path).Scalars("test/accuracy")] == [(1, 0.6), (2, 0.6)]
    write(range(1, 5), 0.5, 1)
    write(range(3, 6), 0.7, 3)  # resumed from the checkpoint of round 2
    assert [(e.step, round(e.value, 6)) for e in _events(tmp_path).Scalars("test/accuracy")] == [
        (1, 0.5), (2, 0.5), (3, 0.7), (4, 0.7), (5, 0.7)]


def test_the_config_flattens_into_hyper_parameters():
    from server.live_curves import flat_hparams

    assert flat_hparams({"seed": 1, "strategy": {"name": "fedavg", "lr": 0.1, "mu": None, "keys": [1, 2]},
                         "resume": False}) == {"seed": 1, "strategy.name": "fedavg", "strategy.lr": 0.1,
                                               "strategy.mu": "null", "strategy.keys": "[1, 2]", "resume": False}
