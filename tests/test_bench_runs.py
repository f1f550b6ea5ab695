"""Resuming benchmarks (bench/runs.py): a finished run is reused only when its config is the same, a
finished run with another config is never overwritten by --reuse, and an unfinished run with the same
config continues from its checkpoint (resume=true). FedCorr runs that differ only in stage 3 share
stages 1-2 (strategy.stages12_from) and the benches say what that saved. And the strategy bench's cells
(bench/strategies_fmnist.py, bench/fedcorr_ablation.py, bench/field_fmnist.py) compose into the configs
their columns name, and the FedCorr bench's summaries over seeds. Nothing here runs a simulation:
``sim.run`` is replaced by a stand-in that writes what a run leaves behind."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from grid import Killed
from omegaconf import OmegaConf

from common.errors import ConfigError
from common.run_files import read_payload
from server.checkpoints import CheckpointStore, Lineage, RunRecord
from settings.compose import compose_config

BENCH = Path(__file__).parents[1] / "bench"


def load_bench(name: str):
    # bench/ is not a package and its data.py would shadow ours on sys.path, so load scripts by path;
    # registered under their own names because the scripts import runs that way.
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runs = load_bench("runs")
load_bench("finished_run")  # the replay scripts import it by name
strategies_bench = load_bench("strategies_fmnist")
fedcorr_bench = load_bench("fedcorr_fmnist")
ablation_bench = load_bench("fedcorr_ablation")
field_bench = load_bench("field_fmnist")


def write_results(out_dir: Path, config: dict, complete: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps({"complete": complete, "config": config, "rounds": [], "summary": {"best_acc": 0.5}}))
    return path


@pytest.fixture
def planned(tmp_path: Path) -> tuple[list[str], dict]:
    overrides = ["experiment=smoke", "strategy=fedavg", f"out_dir={tmp_path / 'fedavg'}"]
    # A simulation has its scene's ground truth, so its results.json config says so (sim.py).
    return overrides, OmegaConf.to_container(compose_config([*overrides, "ground_truth=true"]), resolve=True)


def test_reuse_returns_a_finished_run_with_the_same_config_without_running(planned, tmp_path):
    overrides, config = planned
    assert runs.finished(overrides) is None
    write_results(tmp_path / "fedavg", config)
    assert runs.finished(overrides)["summary"] == {"best_acc": 0.5}
    assert runs.run(overrides, reuse=True)["summary"] == {"best_acc": 0.5}
    # Started under another path to the same folder (relative, through a link, or before it moved).
    write_results(tmp_path / "fedavg", {**config, "out_dir": "outputs/fedavg"})
    runs.check_all([overrides], reuse=True)
    assert runs.finished(overrides)["summary"] == {"best_acc": 0.5}


def test_an_unfinished_run_is_not_reused(planned, tmp_path):
    overrides, config = planned
    write_results(tmp_path / "fedavg", config, complete=False)
    assert runs.finished_results(str(tmp_path / "fedavg"), config) is None
    assert runs.finished_results(str(tmp_path / "elsewhere"), config) is None


def test_reuse_refuses_to_overwrite_a_finished_run_whose_config_changed(planned, tmp_path):
    overrides, config = planned
    stale = {**config, "seed": config["seed"] + 1, "strategy": {**config["strategy"], "lr": 0.5}}
    path = write_results(tmp_path / "fedavg", stale)
    before = path.read_text()
    for attempt in (lambda: runs.check_all([overrides], reuse=True), lambda: runs.run(overrides, reuse=True)):
        with pytest.raises(ConfigError) as err:
            attempt()
        assert "seed" in str(err.value) and "strategy.lr" in str(err.value)
        assert str(tmp_path / "fedavg") in str(err.value)
    assert path.read_text() == before
    runs.check_all([overrides], reuse=False)  # without --reuse a rerun is what was asked for


def test_differing_keys_names_changed_added_and_removed_nested_keys():
    old = {"a": 1, "b": {"c": 2, "d": 3}, "gone": 0}
    new = {"a": 1, "b": {"c": 2, "d": 4, "e": None}, "added": None}
    assert runs.changed_keys(old, new) == ["added", "b.d", "b.e", "gone"]


def test_an_option_added_since_a_run_at_its_as_before_value_is_no_difference():
    stored = {"seed": 1, "strategy": {"name": "fedcorr", "theta": 0.5}}
    planned = {"seed": 1, "participation": {"late": 0.0, "join_round": 2}, "extend_from": None,
               "strategy": {"name": "fedcorr", "theta": 0.5, "stage2_keep": None, "client_score": "cumulative"}}
    assert runs.changed_keys(stored, planned) == [] == runs.changed_keys(planned, stored)
    late = {**planned, "participation": {"late": 0.3, "join_round": 2}}
    other = {**planned, "strategy": {**planned["strategy"], "stage2_keep": 0.2, "client_score": "loss_share"}}
    assert runs.changed_keys(stored, late) == ["participation"]
    assert runs.changed_keys(stored, other) == ["strategy.client_score", "strategy.stage2_keep"]
    # Where both sides have the option, its value is compared as any other's.
    assert runs.changed_keys(planned, other) == ["strategy.client_score", "strategy.stage2_keep"]


def test_strategy_bench_cells_compose_into_the_strategies_their_columns_name():
    columns = list(strategies_bench.COLUMNS)
    plan = strategies_bench.plan_cells(["0.4", "0.8"], "0.5", 600, "fmnist", columns, ["seed=3"])
    assert sorted(plan) == sorted((rho, column) for rho in ("0.4", "0.8") for column in columns)
    out_dirs = set()
    for (rho, column), overrides in plan.items():
        cfg = compose_config(overrides)
        assert (cfg.noise.rho, cfg.noise.tau, cfg.comm_budget, cfg.seed) == (float(rho), 0.5, 600, 3)
        if column.startswith("fedcorr+"):
            assert (cfg.strategy.name, cfg.strategy.stage3) == ("fedcorr", column.removeprefix("fedcorr+"))
        else:
            assert cfg.strategy.name == column
        out_dirs.add(cfg.out_dir)
    assert len(out_dirs) == len(plan)  # no two cells write to one folder
    # A --methods split plans the same cells as the whole table, so split processes share the results.
    whole = strategies_bench.plan_cells(["0.6"], "0.5", 600, "fmnist", columns, [])
    subset = strategies_bench.plan_cells(["0.6"], "0.5", 600, "fmnist", ["poc", "fedcorr+poc"], [])
    assert subset == {cell: whole[cell] for cell in [("0.6", "poc"), ("0.6", "fedcorr+poc")]}


def test_strategy_bench_reports_fedcorrs_shared_stages_and_flags_runs_that_disagree(capsys):
    def fedcorr_run(stage3_acc: float, finetune_end: float) -> dict:
        rounds = [("preprocess", 0.70), ("preprocess", None), ("finetune", 0.86), ("finetune", finetune_end),
                  ("usual", stage3_acc)]
        return {"rounds": [{"stage": stage, "test_acc": acc} for stage, acc in rounds]}

    assert strategies_bench.stages_best_and_last(fedcorr_run(0.95, 0.84)) == (0.86, 0.84)  # stage 3 left out
    agree = {"fedavg": None, "fedcorr+feddyn": fedcorr_run(0.95, 0.84), "fedcorr+poc": fedcorr_run(0.80, 0.84)}
    disagree = {"fedcorr+feddyn": fedcorr_run(0.95, 0.84), "fedcorr+poc": fedcorr_run(0.95, 0.85)}
    strategies_bench.print_shared_stages({"0.4": agree, "0.8": disagree, "0.6": {"fedcorr+poc": None}})
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert lines == ["0.4  best 86.00, last 84.00",
                     "0.8  best 86.00, last 84.00, best 86.00, last 85.00  (the runs disagree)"]


def test_spread_is_mean_and_sample_std_of_the_known_values():
    assert runs.spread([0.881, 0.879, None], scale=100) == "88.00±0.14"
    assert runs.spread([0.5], scale=100) == "50.00" and runs.spread([None]) == "-"


def test_fedcorr_bench_variants_are_named_columns_of_overrides():
    parsed = fedcorr_bench.parse_variants([["global-split", "strategy.split_losses=global"],
                                           ["guard", "strategy.client_split_guard=bic", "seed=2"]])
    assert parsed == {"global-split": ["strategy.split_losses=global"],
                      "guard": ["strategy.client_split_guard=bic", "seed=2"]}
    for bad in ([["fedavg", "x=1"]], [["a/b", "x=1"]], [["lonely"]], [["twice", "x=1"], ["twice", "y=2"]]):
        with pytest.raises(ConfigError, match="--variant .* is invalid"):
            fedcorr_bench.parse_variants(bad)


def test_fedcorr_bench_says_where_the_remaining_wrong_labels_sit():
    rows = [{"finetuned": True, "n_known": 100, "true_noise_after": 0.02},
            {"finetuned": False, "n_known": 100, "true_noise_after": 0.10},
            {"finetuned": False, "n_known": 0, "true_noise_after": float("nan")}]
    payload = {"fedcorr": {"clients": rows},
               "rounds": [{"stage": "finetune", "test_acc": 0.8}, {"stage": "finetune", "test_acc": 0.85},
                          {"stage": "usual", "test_acc": 0.9}]}
    assert fedcorr_bench.remaining_noise(payload) == {"in S_c": 1.0, "outside S_c": 5.0, "clients outside S_c": 2.0,
                                                      "acc end of stage 2": 85.0}


def test_ablation_rows_switch_off_one_table_6_component_each():
    assert ablation_bench.ROWS[0] == "fedcorr" and len(ablation_bench.ROWS) == 7
    for row in ablation_bench.ROWS:
        ablation = compose_config(["experiment=smoke", *ablation_bench.row_overrides(row)]).strategy.ablation
        off = sorted(key for key, kept in ablation.items() if not kept)
        assert off == ([] if row == "fedcorr" else [row.removeprefix("no-").replace("-", "_")])
    assert all(len(paper) == 7 for paper in ablation_bench.PAPER_TABLE_6.values())


# --- resuming a stopped run --------------------------------------------------------------------------


def leave_unfinished(out_dir: Path, config: dict, checkpoint_rounds: tuple[int, ...] = (10,),
                     lineage: Lineage | None = None) -> CheckpointStore:
    """What a run killed after its checkpoints of ``checkpoint_rounds`` leaves: run.json, the
    checkpoint files and an incomplete results.json (in place of whatever the folder held)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    write_results(out_dir, config, complete=False)
    store = CheckpointStore(out_dir)
    store.write_record(RunRecord(config, lineage or Lineage.fresh()))
    for checkpoint_round in checkpoint_rounds:
        (store.dir / f"round-{checkpoint_round:07d}.ckpt").write_bytes(b"")
    return store


@pytest.fixture
def simulations(monkeypatch):
    """``sim.run`` replaced: records each call's overrides and leaves a finished FedCorr-like run (run.json
    with its lineage, a stage-2 checkpoint, results.json whose round 35 ends at 12.5 s)."""
    calls: list[list[str]] = []

    def fake_run(cfg, overrides):
        calls.append(list(overrides))
        config = OmegaConf.to_container(cfg, resolve=True)
        source = config["strategy"].get("stages12_from")
        lineage = Lineage.fresh()
        if source and not config["resume"]:
            lineage = CheckpointStore(source).record().lineage.child(35)
        store = CheckpointStore(config["out_dir"])
        store.write_record(RunRecord(config, lineage))
        (store.dir / "round-0000035-stage.ckpt").write_bytes(b"")
        payload = {"complete": True, "config": config, "summary": {"best_acc": 0.9},
                   "rounds": [{"round": r, "elapsed_s": r * 12.5 / 35} for r in range(1, 41)]}
        Path(config["out_dir"], "results.json").write_text(json.dumps(payload))
        return payload

    monkeypatch.setattr(runs.sim, "run", fake_run)
    return calls


def test_reuse_resumes_an_unfinished_run_with_the_same_config_from_its_latest_checkpoint(
        planned, tmp_path, simulations, capsys):
    overrides, config = planned
    leave_unfinished(tmp_path / "fedavg", config, (10, 20))
    runs.run(overrides, reuse=True)
    assert simulations[-1][-1] == "resume=true"
    assert f"resuming {tmp_path / 'fedavg'} from round 20" in capsys.readouterr().out
    # Its results.json now says resume=true: a later --reuse still takes it as the same run.
    assert json.loads((tmp_path / "fedavg" / "results.json").read_text())["config"]["resume"] is True
    assert runs.run(overrides, reuse=True)["summary"] == {"best_acc": 0.9}
    assert len(simulations) == 1


def test_the_resume_flag_is_added_only_for_an_unfinished_run_with_the_same_config(planned, tmp_path, simulations):
    overrides, config = planned
    out = tmp_path / "fedavg"
    cases = {
        "no --reuse": (config, (10,), False),
        "no checkpoint yet": (config, (), True),
        "another seed": ({**config, "seed": config["seed"] + 1}, (10,), True),
        "another stage-3 strategy": ({**config, "strategy": {**config["strategy"], "lr": 0.5}}, (10,), True),
    }
    for name, (started_with, checkpoints, reuse) in cases.items():
        leave_unfinished(out, started_with, checkpoints)
        runs.run(overrides, reuse=reuse)
        assert "resume=true" not in simulations[-1], name
    # What resume=true itself accepts a change in (how the run executes, and the path to its folder)
    # does not stop the resume.
    for started_with in ({**config, "logging": {"tensorboard": True}}, {**config, "out_dir": "outputs/fedavg"}):
        leave_unfinished(out, started_with, (10,))
        runs.run(overrides, reuse=True)
        assert simulations[-1][-1] == "resume=true"
    assert runs.resume_round(str(tmp_path / "nothing"), config) is None


def test_reuse_ignores_how_a_finished_run_was_started(planned, tmp_path):
    overrides, config = planned
    started = {**config, "resume": True, "strategy": {**config["strategy"], "stages12_from": "elsewhere"}}
    write_results(tmp_path / "fedavg", started)
    assert runs.finished(overrides)["summary"] == {"best_acc": 0.5}


# --- FedCorr's stages 1-2, run once -----------------------------------------------------------------


def fedcorr_plan(tmp_path: Path, columns: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: ["experiment=smoke", "strategy=fedcorr", "comm_budget=60", *extra, f"out_dir={tmp_path / name}"]
            for name, extra in columns.items()}


def test_fedcorr_columns_share_stages_12_when_they_differ_only_in_stage_3(tmp_path):
    plan = fedcorr_plan(tmp_path, {
        "feddyn": ["strategy.stage3=feddyn"],
        "plain": [],
        "poc-lsr": ["strategy.stage3=poc", "strategy.stage3_learner=lsr", "strategy.t3=7",
                    "server.checkpoint_every=3", "comm_budget=90"],
        "no-stage3": ["strategy.ablation.usual_training=false"],
        "other-t2": ["strategy.stage3=poc", "strategy.t2=4"],            # stage 2 differs: its own
        "other-seed": ["strategy.stage3=poc", "seed=2"],                 # another scene: its own
        "other-t2-dyn": ["strategy.stage3=feddyn", "strategy.t2=4"],     # shares with other-t2
        "given": ["strategy.stage3=poc", f"strategy.stages12_from={tmp_path}/x"],  # already set: left alone
    })
    plan["fedavg"] = ["experiment=smoke", "strategy=fedavg", f"out_dir={tmp_path / 'fedavg'}"]
    sources = runs.stages12_groups({name: runs.resolved_config(overrides) for name, overrides in plan.items()})
    # The plain FedCorr run (stage 3 FedAvg) is the source even when planned after another.
    assert sources == {"feddyn": "plain", "poc-lsr": "plain", "no-stage3": "plain", "other-t2-dyn": "other-t2"}


def test_strategy_bench_fedcorr_columns_take_stages_12_from_the_first_one_of_their_rho():
    columns = ["fedavg", "fedcorr+feddyn", "fedcorr+fedmedian", "fedcorr+poc"]
    plan = strategies_bench.plan_cells(["0.4", "0.8"], "0.5", 60, "smoke", columns, [])
    sources = runs.stages12_groups({cell: runs.resolved_config(overrides) for cell, overrides in plan.items()})
    assert sources == {(rho, column): (rho, "fedcorr+feddyn") for rho in ("0.4", "0.8")
                       for column in ("fedcorr+fedmedian", "fedcorr+poc")}


def test_field_bench_fedcorr_columns_share_the_plain_fedcorr_runs_stages_12_per_cell_and_seed():
    columns = ["fedcorr+poc", "fedavg", "fedcorr", "fedcorr+feddyn"]
    plan = {(cell, column, seed): field_bench.cell_run(cell, column, seed, 60, "smoke", [])
            for cell in ("corr-iid", "es-sym0.3") for seed in (1, 2) for column in columns}
    cfg = compose_config(plan["corr-iid", "fedcorr+poc", 1])
    assert (cfg.strategy.name, cfg.strategy.stage3, cfg.out_dir) == (
        "fedcorr", "poc", "outputs/bench-field/smoke-budget60/corr-iid/seed1/fedcorr+poc")
    sources = runs.stages12_groups({key: runs.resolved_config(overrides) for key, overrides in plan.items()})
    assert sources == {(cell, column, seed): (cell, "fedcorr", seed) for cell in ("corr-iid", "es-sym0.3")
                       for seed in (1, 2) for column in ("fedcorr+poc", "fedcorr+feddyn")}
    assert set(field_bench.FEDCORR_WITH) <= set(field_bench.CHOICES) and "fedcorr+fedavg" not in field_bench.CHOICES
    assert field_bench.detection_f1({"fedcorr": {"detection": {"f1": 0.9}}}, "fedcorr+poc") == 0.9
    assert field_bench.detection_f1({"feddiv": {"detection": {"f1": 0.7}}}, "feddiv_code") == 0.7
    code = field_bench.cell_run("corr-iid", "feddiv_code", 1, 600, "fmnist", [])
    assert compose_config(code).strategy.pcs_code_rules, "the column runs FedDiv with the released code's choices"


def test_a_run_takes_stages_12_only_from_a_run_that_kept_its_own_stage_2_checkpoint(tmp_path, capsys):
    plan = fedcorr_plan(tmp_path, {"plain": [], "poc": ["strategy.stage3=poc"]})
    assert runs.stage2_round(plan["poc"]) == 35  # smoke: T1 = 3 iterations of 10 one-client rounds, T2 = 5
    config = runs.resolved_config(plan["plain"])
    assert runs.inheriting(plan["poc"], plan["plain"]) == plan["poc"]  # nothing there yet
    store = leave_unfinished(tmp_path / "plain", config, (30,))
    assert runs.inheriting(plan["poc"], plan["plain"]) == plan["poc"]  # no checkpoint of round 35
    (store.dir / "round-0000035-stage.ckpt").write_bytes(b"")
    assert runs.inheriting(plan["poc"], plan["plain"]) == [*plan["poc"], f"strategy.stages12_from={tmp_path / 'plain'}"]
    store.write_record(RunRecord(config, Lineage.fresh().child(35)))  # took its own stages 1-2 over
    assert runs.inheriting(plan["poc"], plan["plain"]) == plan["poc"]
    assert "runs its own stages 1-2" in capsys.readouterr().out


def test_a_source_that_continued_a_shorter_run_passes_on_that_runs_stages_12(tmp_path, capsys):
    # --budget 90 alone, with the 60 runs on disk: the plain FedCorr run at 90 continued its 60 run,
    # so its folder holds no stage-2 checkpoint; the 60 run, which did its stages 1-2 itself, does.
    plan = fedcorr_plan(tmp_path, {"plain": ["comm_budget=90"], "poc": ["strategy.stage3=poc", "comm_budget=90"],
                                   "plain60": []})
    shorter = leave_unfinished(tmp_path / "plain60", runs.resolved_config(plan["plain60"]), (30, 60))
    (shorter.dir / "round-0000035-stage.ckpt").write_bytes(b"")
    longer = runs.resolved_config([*plan["plain"], f"extend_from={tmp_path / 'plain60'}"])
    leave_unfinished(tmp_path / "plain", longer, (70,), lineage=shorter.record().lineage.child(60))
    assert runs.stages12_origin(str(tmp_path / "plain")) == str(tmp_path / "plain60")
    taken = runs.inheriting(plan["poc"], plan["plain"])
    assert taken == [*plan["poc"], f"strategy.stages12_from={tmp_path / 'plain60'}"]
    runs.load_run(runs.planned(taken)[0])  # the server's check_start accepts that run as the source
    assert "runs its own stages 1-2" not in capsys.readouterr().out
    # Without the shorter run's stage-2 checkpoint the run does its own stages 1-2, and says where it looked.
    (shorter.dir / "round-0000035-stage.ckpt").unlink()
    assert runs.inheriting(plan["poc"], plan["plain"]) == plan["poc"]
    assert f"{tmp_path / 'plain60'} holds no checkpoint of round 35" in capsys.readouterr().out


def test_run_plan_runs_the_source_first_and_the_others_take_its_stages_12_over(tmp_path, simulations, capsys):
    plan = fedcorr_plan(tmp_path, {"poc": ["strategy.stage3=poc"], "plain": [], "dyn": ["strategy.stage3=feddyn"]})
    ledger = runs.Ledger()
    done = runs.run_plan(plan, ["poc", "plain", "dyn"], ledger=ledger)
    assert list(done) == ["poc", "plain", "dyn"]
    source = f"strategy.stages12_from={tmp_path / 'plain'}"
    assert [call[-2:] for call in simulations] == [[f"out_dir={tmp_path / 'plain'}", "ground_truth=true"],
                                                   [source, "ground_truth=true"], [source, "ground_truth=true"]]
    assert [(o.how, o.source, o.stage2_round) for o in ledger.outcomes] == [
        ("ran", None, None), ("inherited", str(tmp_path / "plain"), 35), ("inherited", str(tmp_path / "plain"), 35)]
    assert ledger.shared == 2
    # Run again with --reuse: every run is finished (the inherited ones too, though planned without
    # stages12_from), nothing runs and nothing is saved this time.
    capsys.readouterr()
    again = runs.Ledger()
    assert runs.run_plan(plan, ["poc", "plain", "dyn"], reuse=True, ledger=again) == done
    assert len(simulations) == 3 and [o.how for o in again.outcomes] == ["reused"] * 3
    runs.print_time_saved(again)
    assert "time saved: 0.0 s net = 0.0 s of stages 1-2 not run again by 0 run(s)" in capsys.readouterr().out


def test_a_stopped_inherited_run_resumes_with_its_source_unchanged(tmp_path, simulations, capsys):
    plan = fedcorr_plan(tmp_path, {"plain": [], "poc": ["strategy.stage3=poc"]})
    runs.run(plan["plain"])
    inherited = [*plan["poc"], f"strategy.stages12_from={tmp_path / 'plain'}"]
    leave_unfinished(tmp_path / "poc", runs.resolved_config(inherited), (38,), Lineage.fresh().child(35))
    ledger = runs.Ledger()
    runs.run_plan(plan, ["plain", "poc"], reuse=True, ledger=ledger)
    assert simulations[-1][-3:] == [f"strategy.stages12_from={tmp_path / 'plain'}", "ground_truth=true", "resume=true"]
    assert [(o.how, o.resumed_from) for o in ledger.outcomes] == [("reused", None), ("resumed", 38)]
    assert f"resuming {tmp_path / 'poc'} from round 38" in capsys.readouterr().out


def test_the_time_extending_saved_is_the_shorter_runs_clock_up_to_its_last_round(capsys):
    assert runs.Pending(OmegaConf.create({"extend_from": "out/short"}), [], None, None).how == "extended"
    assert runs.Pending(OmegaConf.create({"extend_from": None}), [], None, None).how == "ran"
    extended = runs.Outcome("out/long", "extended", 7.0,
                            {"attempts": {"extended_from": {"run_dir": "out/short", "round": 60, "elapsed_s": 600.0}}})
    runs.print_time_saved(runs.Ledger([extended, runs.Outcome("out/other", "ran", 3.0, {})]))
    out = capsys.readouterr().out
    assert "out/long continued out/short after its round 60: 600.0 s not run again" in out
    assert "time saved: 600.0 s of shorter runs not run again" in out
    assert "     7.0 s  extended   out/long" in out and "FedCorr's stages 1-2" not in out


def test_a_field_run_extends_its_finished_run_at_a_smaller_budget_when_its_strategy_can(tmp_path, capsys):
    def plan(column: str, budget: int) -> list[str]:
        return field_bench.cell_run("corr-iid", column, 1, budget, "smoke", [], str(tmp_path))

    assert field_bench.shorter_budgets(str(tmp_path), "smoke", 90) == []
    for column in ("fedavg", "fednoro"):  # finished at 30 participations: 10 rounds of 3 clients
        config = runs.resolved_config(plan(column, 30))
        store = leave_unfinished(Path(config["out_dir"]), config, (10,))
        payload = {"complete": True, "config": config, "rounds": [{"round": r} for r in range(1, 11)]}
        Path(config["out_dir"], "results.json").write_text(json.dumps(payload))
    (tmp_path / "bench-field" / "smoke-budget600").mkdir()  # a larger budget is no source
    (tmp_path / "bench-field" / "fmnist-budget60").mkdir()  # nor another experiment
    assert field_bench.shorter_budgets(str(tmp_path), "smoke", 90) == [30]
    source = f"extend_from={store.dir.parent.parent / 'fedavg'}"
    assert runs.extending(plan("fedavg", 90), [plan("fedavg", 60), plan("fedavg", 30)]) == [*plan("fedavg", 90), source]
    assert runs.extending(plan("fednoro", 90), [plan("fednoro", 30)]) == plan("fednoro", 90)
    assert "runs from round 0: extend_from=" in capsys.readouterr().out
    # A finished run that continued another cannot be continued in turn: the next shorter one is.
    middle = runs.resolved_config(plan("fedavg", 60))
    leave_unfinished(Path(middle["out_dir"]), middle, (20,), lineage=store.record().lineage.child(10))
    Path(middle["out_dir"], "results.json").write_text(json.dumps({**payload, "config": middle}))
    assert runs.extending(plan("fedavg", 90), [plan("fedavg", 60), plan("fedavg", 30)]) == [*plan("fedavg", 90), source]
    assert f"does not continue {middle['out_dir']}: that run took rounds from another" in capsys.readouterr().out
    # A run that has started keeps how it started: from round 0, or from the shorter run.
    longer = runs.resolved_config(plan("fedavg", 90))
    leave_unfinished(Path(longer["out_dir"]), longer, (20,))
    assert runs.extending(plan("fedavg", 90), [plan("fedavg", 30)]) == plan("fedavg", 90)
    assert f"{longer['out_dir']} goes on as it began, from round 0" in capsys.readouterr().out
    leave_unfinished(Path(longer["out_dir"]), {**longer, "extend_from": "elsewhere"}, (20,))
    assert runs.extending(plan("fedavg", 90), []) == [*plan("fedavg", 90), "extend_from=elsewhere"]


def test_time_saved_is_the_sources_stages_12_time_less_the_slower_first_round_of_each_run_that_took_them_over(
        tmp_path, capsys):
    # The source: 2 s a round; its stages 1-2 end at round 10 (20 s), round 11 takes 2 s.
    rounds = [{"round": r, "elapsed_s": 2.0 * r} for r in range(1, 13)]
    assert runs.stages12_seconds({"rounds": rounds}, 10) == 20.0
    assert runs.stages12_seconds({"rounds": rounds}, 99) is None
    assert runs.round_seconds({"rounds": rounds}, 11) == 2.0 and runs.round_seconds({"rounds": rounds}, 1) is None
    source = runs.Outcome("out/a", "ran", 30.0, {"rounds": rounds})

    def inherited(name: str, first_round: float, source_dir: str = "out/a") -> runs.Outcome:
        # Its rounds up to 10 are its source's (the results writer continues from the checkpoint).
        own = [*rounds[:10], {"round": 11, "elapsed_s": 20.0 + first_round},
               {"round": 12, "elapsed_s": 23.0 + first_round}]
        return runs.Outcome(f"out/{name}", "inherited", 9.0, {"rounds": own}, source=source_dir, stage2_round=10)

    resumed = runs.Outcome("out/d", "resumed", 5.0, {}, resumed_from=11)
    # A source outside the ledger (a run of an earlier invocation) is read from its rounds.jsonl, whose
    # last line a kill cut short; it has no round 11, so the first round's extra is unknown (not counted).
    far = tmp_path / "far"
    far.mkdir()
    (far / "rounds.jsonl").write_text("".join(json.dumps({"round": r, "elapsed_s": 1.5 * r}) + "\n"
                                              for r in range(1, 11)) + '{"round": 11, "elap')
    ledger = runs.Ledger([source, inherited("b", 5.0), inherited("c", 1.0), resumed,
                          inherited("e", 4.0, str(far))], shared=4)
    saved = runs.time_saved(ledger)
    assert [(s.run.out_dir, s.stages12, s.first_round_extra, s.net) for s in saved] == [
        ("out/b", 20.0, 3.0, 17.0), ("out/c", 20.0, 0.0, 20.0), ("out/e", 15.0, None, 15.0)]
    runs.print_time_saved(ledger)
    out = capsys.readouterr().out
    assert "time saved: 52.0 s net = 55.0 s of stages 1-2 not run again by 3 run(s) - 3.0 s" in out
    assert "elapsed_s at its stage-2 end round" in out
    assert "out/b took them over from out/a (round 10): 20.0 s of stages 1-2; its first round +3.0 s" in out
    assert "    30.0 s  ran        out/a" in out and "     9.0 s  inherited  out/b" in out
    runs.print_time_saved(runs.Ledger([source]))  # nothing planned to share: nothing printed
    assert capsys.readouterr().out == ""


def test_field_bench_ranks_each_papers_methods_against_ours_of_the_same_methods():
    ours = {"best_acc": {"fedavg": 0.85, "fedprox": 0.75, "fedcorr": 0.88, "feddiv": 0.86, "fedes": None},
            "last10_mean_acc": {"fedavg": 0.84, "fedprox": 0.74, "fedcorr": 0.87, "feddiv": 0.80, "fedes": None}}
    assert field_bench.rank_table("corr-iid", ours)[1] == [
        ["FedCorr Table 2", "fedcorr > fedprox > fedavg", "fedcorr > fedavg > fedprox (differs)",
         "fedcorr > fedavg > fedprox (differs)"],
        ["FedDiv Table 1", "feddiv > fedcorr > fedavg", "fedcorr > feddiv > fedavg (differs)",
         "fedcorr > fedavg > feddiv (differs)"],
    ]
    agreeing = {key: {"fedavg": 0.5, "fednoro": 0.6, "fedes": 0.7} for key in ours}
    assert field_bench.rank_table("es-sym0.5", agreeing)[1] == [
        ["FedES Table 1", "fedes > fednoro > fedavg", "fedes > fednoro > fedavg", "fedes > fednoro > fedavg"]]
    assert field_bench.rank_table("es-sym0.5", {key: {"fedavg": 0.5} for key in ours}) is None, "one method: no order"


def field_payload(best: float, final: float, last10: float, f1: float | None = None) -> dict:
    return {"summary": {"best_acc": best, "final_acc": final, "last10_mean_acc": last10},
            "feddiv": {"detection": None if f1 is None else {"f1": f1}}}


def test_a_field_row_says_how_many_planned_runs_it_averages_and_how_far_they_fell_from_their_best():
    runs = [field_payload(0.86, 0.80, 0.81, 0.75), None, field_payload(0.84, 0.80, 0.79, 0.77)]
    cells = field_bench.row("feddiv", runs, 93.41)
    # 2 of the 3 seeds finished; best - last-10 is 5 points on each, so its std is 0.
    assert cells == ["feddiv", "2/3", "85.00±1.41", "80.00±0.00", "80.00±1.41", "5.00±0.00", "-", "0.76±0.01",
                     "93.41", "81.00 / - / 79.00"]
    cells = field_bench.row("fedavg", [None, None], None)
    assert cells == ["fedavg", "0/2", "-", "-", "-", "-", "-", "-", "-", "- / -"], "nothing finished: no figure"
    assert field_bench.row("fedavg", [field_payload(0.85, 0.84, 0.84)], None)[1:6] == [
        "1/1", "85.00", "84.00", "84.00", "1.00"], "one run: no spread"


def test_a_field_row_compares_its_last_10_with_fedavgs_on_the_same_seeds_only():
    fedavg = [field_payload(0.85, 0.84, 0.84), field_payload(0.83, 0.80, 0.80), None]
    runs = [field_payload(0.86, 0.85, 0.85), field_payload(0.82, 0.82, 0.82), field_payload(0.9, 0.9, 0.9)]
    # Seeds 1 and 2: +1 and +2 points; seed 3 has no FedAvg run, so its 90% is left out of the comparison.
    assert field_bench.row("feddiv", runs, None, fedavg)[6] == "1.50±0.71"
    assert field_bench.row("feddiv", runs, None, [None] * 3)[6] == "-", "no FedAvg run finished"
    assert field_bench.row("feddiv", runs, None)[6] == "-", "FedAvg not in the table"


def recall_payload(shirts: int, dataset: str = "fashion_mnist") -> dict:
    """A finished run whose final model classifies 90 - k of the 100 test images of class k correctly
    (the rest as class k + 1), but ``shirts`` of class 6's."""
    counts = [[0] * 10 for _ in range(10)]
    for k in range(10):
        counts[k][k] = shirts if k == 6 else 90 - k
        counts[k][(k + 1) % 10] = 100 - counts[k][k]
    return {"config": {"dataset": {"name": dataset}}, "test_confusion": {"counts": counts}}


def test_the_field_prints_each_methods_final_recall_per_class_and_its_weakest_class():
    payloads = {"fedavg": [recall_payload(60), recall_payload(50), None], "feddiv": [recall_payload(30), None, None],
                "fedes": [None, None, None]}
    header, (fedavg, feddiv) = field_bench.recall_table(["fedavg", "feddiv", "fedes"], payloads)
    assert header[1:] == ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                          "Bag", "Ankle boot", "weakest"]
    assert fedavg == ["fedavg", "90±0", "89±0", "88±0", "87±0", "86±0", "85±0", "55±7", "83±0", "82±0",
                      "81±0", "Shirt"], "mean ± std over the finished seeds, class by class"
    assert feddiv == ["feddiv", "90", "89", "88", "87", "86", "85", "30", "83", "82", "81", "Shirt"]
    assert field_bench.recall_table(["fedavg"], {"fedavg": [recall_payload(95)]})[1][0][-2:] == ["81", "Ankle boot"]
    digits = field_bench.recall_table(["fedavg"], {"fedavg": [recall_payload(95, "digits")]})
    assert digits[0][1:] == [*map(str, range(10)), "weakest"] and digits[1][0][-1] == "9"
    assert field_bench.recall_table(["fedavg"], {"fedavg": [None, {"config": {}}]}) is None, "no matrix: no table"


def course_payload(accuracies: list[float | None]) -> dict:
    """A finished run of rounds of 10 participations with these test accuracies (None: not evaluated)."""
    return {"rounds": [{"comm_cost": 10 * (k + 1), "test_acc": acc} for k, acc in enumerate(accuracies)]}


def test_the_field_prints_the_course_of_a_longer_run_from_the_last_100_participations_before_each_point():
    # Seed 1: 0.80 up to 600, then 0.90; seed 2: 0.70, then 0.80, with round 100's evaluation missing.
    one = course_payload([0.8] * 60 + [0.9] * 60)
    two = course_payload([0.7] * 60 + [0.8] * 39 + [None, 0.8, 0.8] + [0.8] * 18)
    assert field_bench.window_mean(one, 600) == pytest.approx(0.8)
    assert field_bench.window_mean(one, 650) == pytest.approx(0.85), "rounds 56-65: five of each"
    assert field_bench.window_mean(two, 1000) == pytest.approx(0.8), "the round not evaluated is left out"
    assert field_bench.window_mean(one, 2000) is None and field_bench.window_mean(None, 600) is None
    header, rows = field_bench.course_table(["fedavg", "fedcorr"], {"fedavg": [one, two, None],
                                                                   "fedcorr": [None] * 3}, 1200)
    assert header == ["method", "600", "1000", "1200"], "the points below the budget, and the budget"
    assert rows == [["fedavg", "75.00±7.07", "85.00±7.07", "85.00±7.07"]], "no row for a method without runs"
    assert field_bench.course_table(["fedavg"], {"fedavg": [one]}, 600) is None, "one point: no course"
    assert field_bench.course_table(["fedavg"], {"fedavg": [None, None]}, 1200) is None, "no run: no course"


def test_the_field_report_prints_the_same_tables_in_markdown_for_the_docs(capsys):
    def finished(last10: float, shirts: int) -> dict:
        return {**course_payload([last10] * 120), **field_payload(last10 + 0.02, last10, last10),
                **recall_payload(shirts)}

    # FedCorr's run of seed 2 has not finished; FedProx's only run is above FedAvg's, unlike FedCorr's paper.
    done = {("corr-iid", "fedavg", 1): finished(0.84, 60), ("corr-iid", "fedavg", 2): finished(0.82, 50),
            ("corr-iid", "fedcorr", 1): finished(0.88, 70), ("corr-iid", "fedcorr", 2): None,
            ("corr-iid", "fedprox", 1): None, ("corr-iid", "fedprox", 2): finished(0.9, 40)}
    printed = {}
    for markdown in (False, True):
        args = argparse.Namespace(experiment="fmnist", overrides=[], cells=["corr-iid"], markdown=markdown,
                                  columns=["fedavg", "fedcorr", "fedprox"], tables=list(field_bench.TABLES))
        field_bench.print_table(args, 1200, {"corr-iid": [1, 2]}, done)
        printed[markdown] = capsys.readouterr().out.splitlines()
    # Each Markdown table stands between blank lines, so that no renderer takes its caption for a row.
    edges = [k for k, line in enumerate(printed[True]) if line.startswith("|")
             and not (printed[True][k - 1].startswith("|") and printed[True][k + 1].startswith("|"))]
    assert len(edges) == 8 and all(printed[True][k - 1] == "" for k in edges[::2])
    assert all(printed[True][k + 1] == "" for k in edges[1::2])
    # Four tables (the cell's rows, the papers' ranks, the course, the recall), each a header, a rule, rows.
    assert [line.count("---") for line in printed[True] if line.startswith("|---")] == [10, 4, 4, 12]
    tables = [line.strip("| ").split(" | ") for line in printed[True] if line.startswith("| ")]
    assert tables[1:4] == [["fedavg", "2/2", "85.00±1.41", "83.00±1.41", "83.00±1.41", "2.00±0.00", "-", "-", "81.22",
                            "84.00 / 82.00"],
                           ["fedcorr", "1/2", "90.00", "88.00", "88.00", "2.00", "4.00", "-", "92.50", "88.00 / -"],
                           ["fedprox", "1/2", "92.00", "90.00", "90.00", "2.00", "8.00", "-", "85.25", "- / 90.00"]]
    assert tables[5] == ["FedCorr Table 2", "fedcorr > fedprox > fedavg", "fedprox > fedcorr > fedavg (differs)",
                         "fedprox > fedcorr > fedavg (differs)"]
    assert tables[-3][-2:] == ["81±0", "Shirt"] and tables[-1][-2:] == ["81", "Shirt"]
    # The terminal's fixed-width lines hold the same cells, and the lines around the tables are the same.
    starts = ("method", "paper", "fedavg", "fedcorr", "fedprox", "FedCorr", "FedDiv")
    texts = [line for line in printed[False] if line.partition(" ")[0] in starts]
    assert [line.split() for line in texts] == [" ".join(cells).split() for cells in tables]
    assert [line for line in printed[True] if line and not line.startswith("|")] == [
        line for line in printed[False] if line and line not in texts]
    # --tables rows ranks: the block docs/results.md keeps, without the course and the recall.
    args.tables = ["rows", "ranks"]
    field_bench.print_table(args, 1200, {"corr-iid": [1, 2]}, done)
    kept = capsys.readouterr().out.splitlines()
    assert [line.count("---") for line in kept if line.startswith("|---")] == [10, 4]
    rows_and_ranks = [line for line in printed[True] if line.startswith("| ")][:7]
    assert [line for line in kept if line.startswith("| ")] == rows_and_ranks
    assert not any(line.startswith(("the course", "final recall")) for line in kept)


memorisation = load_bench("memorisation")


def write_rounds(run: Path, accuracies: list[float | None], per_round: int = 10) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    lines = ["round,stage,test_acc,test_loss,clients,comm_cost,train_loss,elapsed_s"]
    lines += [f"{r},fedavg,{'' if acc is None else acc},0.5,1 2,{r * per_round},0.4,{r}.0"
              for r, acc in enumerate(accuracies, start=1)]
    (run / "rounds.csv").write_text("\n".join(lines) + "\n")
    return run


def test_memorisation_finds_the_budget_from_which_last_10_stays_under_the_earlier_best(tmp_path, capsys):
    # Rising for 30 rounds to 0.80, flat to round 50, then falling 0.5 points a round to round 80.
    curve = [0.5 + 0.01 * r for r in range(1, 31)] + [0.8] * 20 + [0.8 - 0.005 * r for r in range(1, 31)]
    curve[40] = None  # a round that was not evaluated
    points = memorisation.points(memorisation.read_rounds(write_rounds(tmp_path / "a", curve)), 100)
    assert [p.budget for p in points] == [200, 300, 400, 500, 600, 700, 800]
    assert points[1].drop < 0, "still rising: the last 10 lie above the best before them"
    assert abs(points[-1].drop - 100 * (0.8 - (0.8 - 0.005 * 25.5))) < 1e-9 and points[-1].best_round == 30
    drops = [(p.budget, p.drop) for p in points]
    assert memorisation.fallen_from(drops, 2.0) == 600
    assert memorisation.fallen_from([(1, 3.0), (2, 1.0), (3, 2.5)], 2.0) == 3, "fallen must stay fallen"
    assert memorisation.fallen_from(drops, 50.0) is None
    write_rounds(tmp_path / "b", [0.5 + 0.01 * r for r in range(1, 81)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["memorisation.py", str(tmp_path / "a"), str(tmp_path / "b"), "--step", "200"])
        memorisation.main()
    out = capsys.readouterr().out
    assert "memorisation budget (drop >= 2.0 points from there on): 600" in out
    assert "memorisation budget (drop >= 2.0 points from there on): not reached" in out
    assert "mean drop over the 2 runs: 200 " in out


plus_bench = load_bench("fedcorr_plus")


def test_fedcorr_plus_columns_are_fedcorr_with_one_switch_each_at_the_same_budget():
    paper = compose_config(plus_bench.cell_run("noniid-0.8", "paper", 2, []))
    assert (paper.strategy.name, paper.comm_budget, paper.noise.rho, paper.partition.name, paper.seed) == (
        "fedcorr", 600, 0.8, "fedcorr_noniid", 2)
    for column, overrides in plus_bench.PARTS.items():
        run = compose_config(plus_bench.cell_run("noniid-0.8", column, 2, []))
        differing = [key for key in PLUS_SWITCHES if run.strategy[key] != paper.strategy[key]]
        assert len(differing) == 1 and f"strategy.{differing[0]}" in overrides[0], column
        assert run.out_dir.endswith(f"bench-fedcorr-plus/noniid-0.8/seed2/{column}")
    for column, parts in plus_bench.COMBINED.items():
        run = compose_config(plus_bench.cell_run("late-s2", column, 2, []))
        differing = {key for key in PLUS_SWITCHES if run.strategy[key] != paper.strategy[key]}
        assert differing == {plus_bench.PARTS[part][0].split("=")[0].removeprefix("strategy.") for part in parts}
    plus = compose_config(plus_bench.cell_run("iid-0.6", "plus", 1, []))
    assert plus.strategy == compose_config(["strategy=fedcorr_plus"]).strategy
    assert plus.strategy.name == "fedcorr" and plus.strategy != paper.strategy
    late = compose_config(plus_bench.cell_run("late-s2", "paper", 1, []))
    assert (late.participation.late, late.participation.join_round, late.noise.rho) == (0.3, 141, 0.6)


PLUS_SWITCHES = ("client_score", "client_components", "stage2_rows", "stage2_keep", "joiners")


def plus_run(f1, flagged, noise, precision, best, final, late_f1=None, late_missed=None, queries=0.0, equal=None,
             last10=None):
    best_equal, final_equal = equal or (best, final)
    return {"f1": f1, "flagged": flagged, "noise": noise, "precision": precision, "best": best, "final": final,
            "last10": last10, "late_f1": late_f1, "late_missed": late_missed, "queries": queries,
            "best_equal": best_equal, "final_equal": final_equal}


def test_fedcorr_plus_targets_say_which_are_met_and_by_what_figure_one_is_missed():
    paper = {"iid-0.6": [plus_run(0.99, 60, 0.072, 0.85, 0.881, 0.879)],
             "clean": [plus_run(None, 40, 0.05, 0.2, 0.89, 0.888)]}
    good = {"iid-0.6": [plus_run(0.97, 60, 0.030, 0.95, 0.882, 0.880), plus_run(0.96, 61, 0.034, 0.94, 0.881, 0.879)],
            "clean": [plus_run(None, 0, 0.0, None, 0.891, 0.889)]}
    assert plus_bench.targets("bic-components", good, paper) == [
        "detection F1 >= 0.95 on every seed: met", "no client flagged at clean: met",
        "iid-0.6: label noise <= 3.5% with precision >= 0.93: met (3.20%, 0.945)",
        "best and final accuracy not below the paper's: met",
        "best and final accuracy at equal model transfers not below the paper's: met"]
    # Cut where its transfers equal the paper's, the second seed ends lower: the mean final falls under.
    weak = {"iid-0.6": [plus_run(0.97, 60, 0.05, 0.9, 0.87, 0.88),
                        plus_run(0.90, 61, 0.04, 0.92, 0.881, 0.879, queries=200.0, equal=(0.881, 0.869))]}
    assert plus_bench.targets("stage2-subset", weak, paper) == [
        "detection F1 >= 0.95 on every seed: missed at iid-0.6 (0.900)",
        "iid-0.6: label noise <= 3.5% with precision >= 0.93: missed (4.50%, 0.910)",
        "best and final accuracy not below the paper's: missed (points under: iid-0.6 best 0.55)",
        "best and final accuracy at equal model transfers not below the paper's: missed (points under: "
        "iid-0.6 best 0.55, iid-0.6 final 0.45)"]
    assert plus_bench.targets("paper", paper, paper)[1] == "no client flagged at clean: missed ([40])"
    assert plus_bench.targets("plus", good, {})[-2:] == [
        "best and final accuracy not below the paper's: not compared (no paper run in these cells)",
        "best and final accuracy at equal model transfers not below the paper's: not compared (no paper run in "
        "these cells)"]
    late = {"late-s2": [plus_run(0.99, 60, 0.07, 0.85, 0.88, 0.87, 0.0, 18.0),
                        plus_run(0.99, 60, 0.07, 0.85, 0.88, 0.87, 0.95, 1.0)]}
    assert plus_bench.targets("paper", late, {})[1] == (
        "late-s2: late joiners' detection F1 >= 0.9 on every seed: missed (lowest 0.000; noisy joiners missed per "
        "seed [18.0, 1.0])")
    # Three queries move the model three times, as 1.5 participations do: the run is read up to 6 - 1.5.
    rounds = [{"comm_cost": cost, "test_acc": acc} for cost, acc in ((2, 0.5), (3, None), (4, 0.88), (6, 0.87))]
    payload = {"summary": {"best_acc": 0.88, "final_acc": 0.87, "last10_mean_acc": 0.86, "comm_cost": 6},
               "rounds": rounds,
               "fedcorr": {"detection": None, "detected_noisy_clients": [3, 4], "relabel_precision": 0.5,
                           "label_noise": {"after_stage2": 0.01},
                           "iterations": [{"disagreement": {"3": 0.6, "4": 0.7, "5": 0.1}}, {"lid": {"3": 1.0}}]}}
    assert plus_bench.figures(payload) == plus_run(None, 2.0, 0.01, 0.5, 0.88, 0.87, queries=3.0, equal=(0.88, 0.88),
                                                   last10=0.86)
    rounds[2]["test_acc"] = 0.86
    assert plus_bench.figures(payload)["best_equal"] == plus_bench.figures(payload)["final_equal"] == 0.86


def test_the_mutation_bench_without_mutmut_says_how_to_install_it_before_any_work(monkeypatch, capsys):
    mutation = load_bench("mutation")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "mutmut"
                        else find_spec(name, *rest))
    monkeypatch.setattr(mutation, "WORK", Path("/nonexistent/mutants"))  # a run would empty this folder first
    monkeypatch.setattr(mutation.subprocess, "run", lambda *args, **kwargs: pytest.fail("a file was mutated"))
    monkeypatch.setattr(sys, "argv", ["bench/mutation.py", "task/lid.py"])
    assert mutation.main() == 2
    assert capsys.readouterr().err == (
        'error: bench/mutation.py needs mutmut, the mutation extra: .venv/bin/python -m pip install -e ".[mutation]"\n')


def test_relabel_rules_keep_a_likely_or_close_second_label_and_the_floor_relabels_only_where_it_helps():
    relabel = load_bench("relabel_rules")
    labels = np.array([0, 1, 2, 2])
    probabilities = np.array([[0.1, 0.8, 0.1],     # confident, label unlikely: every rule takes the argmax
                              [0.55, 0.4, 0.05],   # the label is second, 0.15 behind
                              [0.6, 0.1, 0.3],     # the label is second, 0.3 behind, at probability 0.3
                              [0.45, 0.1, 0.45]])  # under theta: kept by every rule
    assert relabel.theta_rule(0.5)(labels, probabilities).tolist() == [1, 0, 0, 2]
    assert relabel.theta_rule(0.7)(labels, probabilities).tolist() == [1, 1, 2, 2]
    assert relabel.theta_rule(0.5, keep=0.35)(labels, probabilities).tolist() == [1, 1, 0, 2]
    assert relabel.keep_second(0.5, 0.2)(labels, probabilities).tolist() == [1, 1, 0, 2]
    assert relabel.keep_second(0.5, 0.5)(labels, probabilities).tolist() == [1, 1, 2, 2]
    truth = np.array([1, 0, 2, 1])
    run = relabel.Stage2(theta=0.5, keep=None, corrected={7: (truth, labels, labels, probabilities)}, others_wrong=5,
                         samples=100)
    # The paper's rule: 2 changes right (rows 0, 1), 1 wrong (row 2); row 3 stays wrong.
    assert relabel.replay(run, relabel.theta_rule(0.5)) == (3, 2, 2 + 5)
    # The floor changes exactly the rows whose label is wrong and argmax right: row 3 has neither.
    assert relabel.replay(run, None) == (2, 2, 1 + 5)


def test_the_stage_2_replay_of_a_finished_run_gives_its_stored_labels_and_a_floor_under_them(run_inprocess, tmp_path):
    relabel = load_bench("relabel_rules")
    payload, _ = run_inprocess("experiment=smoke strategy.train.epochs=1 strategy.t2=2 strategy.t3=1")
    run_dir = tmp_path / "run"
    run = relabel.stage2(run_dir)
    assert sorted(run.corrected) == sorted(set(range(10)) - set(payload["fedcorr"]["finetune_clients"]))
    relabel.check_replay(run_dir, run)  # the client's own rule reproduces the stored labels of each client
    changed, right, wrong = relabel.replay(run, relabel.theta_rule(run.theta))
    assert wrong / run.samples == pytest.approx(payload["fedcorr"]["label_noise"]["after_stage2"])
    assert changed == payload["fedcorr"]["relabel_by_step"]["stage2"]["relabeled"] > 0
    floor = relabel.replay(run, None)
    assert floor[1] == floor[0] and floor[2] <= wrong
    # Labels the run did not make are caught: the replay then reads another run than the one stored.
    truth, labels, after, probabilities = run.corrected[min(run.corrected)]
    tampered = {**run.corrected, min(run.corrected): (truth, labels, (after + 1) % 10, probabilities)}
    with pytest.raises(ConfigError, match="does not give the stored labels"):
        relabel.check_replay(run_dir, relabel.Stage2(run.theta, run.keep, tampered, run.others_wrong, run.samples))


def test_the_stage_2_replay_reads_a_run_stopped_in_stage_3_as_the_run_finished(run_inprocess, tmp_path):
    relabel = load_bench("relabel_rules")
    overrides = "experiment=smoke strategy.train.epochs=1 strategy.t2=2 strategy.t3=3"
    _, whole = run_inprocess(overrides)
    with pytest.raises(Killed):
        run_inprocess(overrides, kill_at=len(whole.delivered) - 1)  # in stage 3's last round
    stopped = read_payload(tmp_path / "run-2")
    assert not stopped["complete"] and stopped["rounds"][-1]["stage"] == "usual"
    run, finished = relabel.stage2(tmp_path / "run-2"), relabel.stage2(tmp_path / "run")
    relabel.check_replay(tmp_path / "run-2", run)
    assert sorted(run.corrected) == sorted(finished.corrected)
    for rule in relabel.rules(run.theta).values():
        assert relabel.replay(run, rule) == relabel.replay(finished, rule)


def test_the_stage_2_replay_refuses_a_run_that_stopped_before_stage_2_ended(tmp_path):
    relabel = load_bench("relabel_rules")
    # A run in progress: results.json without its rounds, which rounds.jsonl holds a line each.
    (tmp_path / "results.json").write_text(json.dumps({"complete": False, "config": {}, "fedcorr": {}}))
    rounds = tmp_path / "rounds.jsonl"
    rounds.write_text(json.dumps({"round": 1, "stage": "preprocess"}) + "\n")
    with pytest.raises(ConfigError, match=r"is invalid: allowed is the folder of a FedCorr run past stage 2 \("):
        relabel.stage2(tmp_path)
    with open(rounds, "a") as more:
        more.write(json.dumps({"round": 2, "stage": "finetune"}) + "\n")
    with pytest.raises(ConfigError, match="is invalid: it stopped in stage 2, after round 2; allowed is the folder"):
        relabel.stage2(tmp_path)


def test_client_split_scores_follow_the_strategy_and_the_joiners_pass_adds_to_the_earlier_split():
    split = load_bench("client_split")
    it = split.Iteration
    # Clients 0-3 train in iterations 1-2; 4 and 5 join for their own pass (t1 = 2).
    run = split.Run(Path("r"), seed=1, own_rule="loss_share bic", t1=2, noisy={2, 3, 5},
                    iterations=[it({0: 1.0, 1: 1.2, 2: 3.0, 3: 3.2},
                                   {"loss_share": {0: 0.3, 1: 0.32, 2: 0.7, 3: 0.72}}, [2, 3]),
                                it({0: 1.1, 1: 1.0, 2: 2.8, 3: 3.1},
                                   {"loss_share": {0: 0.31, 1: 0.3, 2: 0.6, 3: 0.71}}, [2, 3]),
                                it({4: 1.0, 5: 2.9}, {"loss_share": {4: 0.33, 5: 0.69}}, [2, 3, 5])])
    assert {pid: v[0] for pid, v in split.scores(run, 1, "cumulative").items()} == pytest.approx(
        {0: 2.1, 1: 2.2, 2: 5.8, 3: 6.3})
    assert {pid: v[0] for pid, v in split.scores(run, 2, "mean").items()} == pytest.approx(
        {0: 1.05, 1: 1.1, 2: 2.9, 3: 3.15, 4: 1.0, 5: 2.9})
    assert split.scores(run, 1, "share_mean")[2][0] == pytest.approx(0.65)
    # The joiners' pass reads everyone, the others at their last iteration.
    assert sorted(split.scores(run, 2, "loss_share")) == [0, 1, 2, 3, 4, 5]
    assert split.scores(run, 2, "loss_share")[0][0] == 0.31
    assert split.scores(run, 1, "2-D")[3].tolist() == [3.1, 0.71]
    assert split.replay(run, "loss_share two") == [[2, 3], [2, 3], [2, 3, 5]]
    assert split.replay(run, "disagreement two") == [None, None, None], "a score the run did not record"
    assert split.f1(run, [2, 3, 5], {0, 1, 2, 3, 4, 5}) == 1.0
    assert split.f1(run, [2], {0, 1, 2, 3}) == pytest.approx(2 / 3)
    # Two components on (LID, share): the one with the higher share is flagged, whatever LID says.
    values = np.array([[5.0, 0.3], [5.1, 0.31], [4.9, 0.29], [1.0, 0.8], [1.1, 0.81], [0.9, 0.79]])
    assert split.two_d(values, seed=1).tolist() == [False, False, False, True, True, True]


@pytest.mark.parametrize("score", ["loss_share", "disagreement"])
def test_the_client_split_replay_of_a_finished_run_reproduces_its_flags_and_refuses_other_flags(run_inprocess,
                                                                                                 tmp_path, capsys,
                                                                                                 score):
    split = load_bench("client_split")
    payload, _ = run_inprocess("experiment=smoke strategy.train.epochs=1 strategy.t2=1 strategy.t3=1 "
                               f"strategy.client_score={score}")
    run = split.load(tmp_path / "run")
    assert run.own_rule == f"{score} two" and len(run.iterations) == run.t1 > 1
    assert all(set(it.shares) == {score} and set(it.shares[score]) == set(it.lid) for it in run.iterations)
    assert run.noisy == set(payload["fedcorr"]["true_noisy_clients"])
    finals = split.report(run)
    assert finals[f"{score} two"] == (pytest.approx(payload["fedcorr"]["detection"]["f1"]),
                                      len(payload["fedcorr"]["detected_noisy_clients"]))
    assert set(finals) == set(split.RULES)
    (unrecorded,) = set(split.SHARES) - {score}
    assert finals[f"{unrecorded} two"] == (None, None), "a score the run did not ask for is not replayed"
    if score == "disagreement":
        # Computed again from the stage-1-end checkpoint and the labels then, they are the ones the clients sent.
        *earlier, last = run.iterations
        bare = split.Run(run.path, run.seed, run.own_rule, run.t1, run.noisy,
                         [*earlier, split.Iteration(last.lid, {}, last.flagged)])
        replayed = split.with_checkpoint_disagreement(bare).iterations[-1].shares["disagreement"]
        assert replayed == pytest.approx(last.shares["disagreement"], abs=1e-9)
        assert split.with_checkpoint_disagreement(run) is run, "a recorded score is kept"
    assert "(reproduced)" in capsys.readouterr().out
    other = split.Run(run.path, run.seed, run.own_rule, run.t1, run.noisy,
                      [*run.iterations[:-1], split.Iteration(run.iterations[-1].lid, run.iterations[-1].shares,
                                                             sorted(set(range(10)) - set(run.iterations[-1].flagged)))])
    with pytest.raises(ConfigError, match=f"its own rule .* at iteration {run.t1}"):
        split.report(other)
    with pytest.raises(ConfigError, match="no results.json"):
        split.load(tmp_path / "nowhere")


def test_the_client_split_summary_scores_noisy_runs_and_counts_the_flagged_of_clean_ones(capsys):
    split = load_bench("client_split")
    unreplayed = dict.fromkeys(split.RULES, (None, None))
    split.summary({Path("a"): {**unreplayed, "mean two": (1.0, 60)}, Path("b"): {**unreplayed, "mean two": (0.9, 55)},
                   Path("clean"): {**unreplayed, "mean two": (None, 3)}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["  mean two         0.950 0.900 1/2 (b); flagged without noisy clients: [3]"]


def test_a_finished_runs_record_outlives_its_outputs_and_is_reused_after_restore(tmp_path, capsys):
    records_bench = load_bench("records")
    outputs, records = tmp_path / "outputs", tmp_path / "records"
    run_dir = outputs / "bench-field" / "fmnist-budget600" / "corr-iid" / "seed1" / "fedavg"
    overrides = ["experiment=smoke", "strategy=fedavg", f"out_dir={run_dir}"]
    config = OmegaConf.to_container(compose_config([*overrides, "ground_truth=true"]), resolve=True)
    original = write_results(run_dir, config).read_text()
    write_results(outputs / "bench-field" / "fmnist-budget600" / "corr-iid" / "seed1" / "fedcorr", config,
                  complete=False)
    assert records_bench.save(outputs, records, "bench-*") == (1, 0)
    assert sorted(path.relative_to(records).as_posix() for path in records.rglob("*.json")) == [
        "bench-field/fmnist-budget600/corr-iid/seed1/fedavg.json"]
    assert records_bench.save(outputs, records, "bench-*") == (0, 1)

    shutil.rmtree(outputs)  # the machine that made the run is gone
    assert runs.finished(overrides) is None
    assert records_bench.restore(outputs, records, "bench-field") == (1, 0)
    assert json.loads((run_dir / "results.json").read_text()) == json.loads(original)
    assert runs.run(overrides, reuse=True)["summary"] == {"best_acc": 0.5}  # reused: nothing ran
    # It has no checkpoints: a longer run cannot continue it, runs from round 0 and says why.
    longer = ["experiment=smoke", "strategy=fedavg", "comm_budget=900", f"out_dir={outputs / 'longer'}"]
    assert runs.extending(longer, [overrides]) == longer
    said = capsys.readouterr().out
    assert f"runs from round 0: extend_from='{run_dir}' is invalid" in said and "no checkpoints/run.json" in said

    # A folder's own results, finished or in progress, are never replaced by a record.
    write_results(run_dir, config, complete=False)
    assert records_bench.restore(outputs, records, "bench-*") == (0, 1)
    assert runs.finished(overrides) is None


def test_every_field_record_is_still_the_same_run_as_the_field_plans_it_now():
    # A default changed, or an option added without its as-before value, would make --reuse refuse
    # the field's finished runs (and a stopped one would not resume): each record must still be the
    # run the field bench plans at its budget, cell, seed and column.
    # One composition per budget, cell and column (three seeds' records share it): the seed changes only
    # the seed and the folder, which the first assertion checks on one planned run.
    def plan(cell: str, column: str, seed: int, budget: int) -> dict:
        return runs.resolved_config(field_bench.cell_run(cell, column, seed, budget, "fmnist", []))

    one, other = plan("corr-iid", "fedcorr", 1, 600), plan("corr-iid", "fedcorr", 2, 600)
    assert runs.changed_keys(one, {**other, "seed": 1}, runs.REUSE_IGNORES) == []
    records = sorted((BENCH.parent / "docs" / "records" / "bench-field").glob("fmnist-budget*/*/seed*/*.json"))
    assert len(records) >= 40
    planned: dict[tuple[str, str, int], dict] = {}
    for record in records:
        budget = int(record.parts[-4].removeprefix("fmnist-budget"))
        cell, seed, column = record.parts[-3], int(record.parts[-2].removeprefix("seed")), record.stem
        stored = json.loads(record.read_text())["config"]
        if (cell, column, budget) not in planned:
            planned[cell, column, budget] = plan(cell, column, seed, budget)
        seeded = {**planned[cell, column, budget], "seed": seed}
        assert runs.changed_keys(stored, seeded, runs.REUSE_IGNORES) == [], record


def test_records_refuse_a_missing_folder_in_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    records_bench = load_bench("records")
    monkeypatch.setattr(sys, "argv", ["bench/records.py", "restore", "--records", str(tmp_path / "none"),
                                      "--outputs", str(tmp_path / "outputs")])
    with pytest.raises(SystemExit) as stop:
        records_bench.main_with_clear_errors(records_bench.main)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"error: --records={tmp_path / 'none'} is invalid: "
                                       "allowed is an existing folder\n")
    assert not (tmp_path / "outputs").exists()


def test_the_field_report_says_which_commits_its_runs_were_made_at():
    def made(*attempts: tuple[str, bool] | None) -> dict:
        return {"provenance": [{"git": None if attempt is None else {"commit": attempt[0], "dirty": attempt[1]}}
                               for attempt in attempts]}

    runs_ = [made(("7c69eab30de8", False)), made(("7c69eab30de8", False), ("144f9e1aaaa", True)),
             made(("7c69eab30de8", False), ("7c69eab30de8", False)), made(None), None]
    assert field_bench.made_at(runs_) == ("runs made at commit 7c69eab (3), 144f9e1 (1), unknown (1); "
                                          "1 from a checkout with uncommitted changes")
    assert field_bench.made_at([None]) == "no run has finished"


def leave_finished_field_run(config: dict, lineage: Lineage | None = None) -> dict:
    """What a finished smoke run of ``config`` leaves: budget / 3 rounds (3 clients a round), its run.json
    and last checkpoint (so a longer run can continue it), a FedCorr stage-2 checkpoint (round 35, so
    another run can take its stages 1-2 over) and results.json; returns the payload."""
    last = config["comm_budget"] // 3
    store = CheckpointStore(config["out_dir"])
    store.write_record(RunRecord(config, lineage or Lineage.fresh()))
    (store.dir / f"round-{last:07d}.ckpt").write_bytes(b"")
    (store.dir / "round-0000035-stage.ckpt").write_bytes(b"")
    summary = {"best_acc": 0.8, "final_acc": 0.7, "last10_mean_acc": 0.7}
    rounds = [{"round": r, "test_acc": 0.7, "comm_cost": 3 * r, "elapsed_s": r} for r in range(1, last + 1)]
    payload = {"complete": True, "config": config, "summary": summary, "rounds": rounds,
               "provenance": [{"git": {"commit": "7c69eab30de8", "dirty": False}}]}
    Path(config["out_dir"], "results.json").write_text(json.dumps(payload))
    return payload


def field_argv(tmp_path: Path, *extra: str, budgets: tuple[str, ...] = ("90", "30")) -> list[str]:
    return ["bench/field_fmnist.py", "--experiment", "smoke", "--cells", "corr-iid", "--seeds", "1", "--more-seeds",
            "--budget", *budgets, "--outputs", str(tmp_path), *extra]


def test_the_field_names_each_cells_leader_on_the_seeds_every_method_finished_and_its_paired_margin():
    def runs_of(*last10: float | None) -> list[dict | None]:
        return [None if value is None else {"summary": {"last10_mean_acc": value}} for value in last10]

    # Seed 3 is left out everywhere, as fedprox has not finished it: fedavg's 0.99 there would lead.
    methods = {"fedavg": runs_of(0.79, 0.80, 0.99), "fedcorr": runs_of(0.80, 0.82, 0.70),
               "fedprox": runs_of(0.70, 0.71, None)}
    assert field_bench.leader(methods, [1, 2, 3]) == (
        "leader by last-10 on seeds 1 and 2, where every method finished: fedcorr 81.00, 1.50±0.71 points over "
        "fedavg (paired per seed)")
    methods["fedprox"][1] = None
    one_seed = field_bench.leader(methods, [1, 2, 3])
    assert one_seed == ("leader by last-10 on seed 1, where every method finished: fedcorr 80.00, 1.00 points over "
                        "fedavg (paired per seed)")
    methods["fedprox"][0] = None
    assert field_bench.leader(methods, [1, 2, 3]) is None, "no seed that every method finished"
    assert field_bench.leader({"fedavg": runs_of(0.8)}, [1]) is None, "one method leads nothing"


def test_the_field_says_whether_a_run_made_again_repeats_the_rounds_of_the_same_run(tmp_path):
    columns = ("fedavg", "fedprox", "fednoro")
    plans = {budget: {("corr-iid", column, 1): field_bench.cell_run("corr-iid", column, 1, budget, "smoke", [],
                                                                     str(tmp_path)) for column in columns}
             for budget in (30, 90)}

    def payload(budget: int, changed: int | None = None, extended: dict | None = None) -> dict:
        # Each budget's rounds took their own time: only the figures must repeat.
        rounds = [{"round": r, "test_acc": 0.5 + r / 100, "elapsed_s": budget * r} for r in range(1, budget // 3 + 1)]
        if changed is not None:
            rounds[changed - 1]["test_acc"] += 1e-9
        return {"rounds": rounds, "attempts": {"resumed_at": [], "stages12_from": None, "extended_from": extended}}

    # FedNoRo's rounds depend on its budget: never compared, though its longer run differs at round 6.
    done = {30: {key: payload(30) for key in plans[30]},
            90: {("corr-iid", "fedavg", 1): payload(90), ("corr-iid", "fedprox", 1): payload(90),
                 ("corr-iid", "fednoro", 1): payload(90, changed=6)}}
    said = ("the same run made again: {} runs at a larger budget ran from round 0 while the same run at 30 had "
            "finished; ")
    same = "each repeats that run's rounds in every figure but the time"
    assert field_bench.repeats(plans, done) == said.format(2) + same
    done[90][("corr-iid", "fedprox", 1)] = payload(90, changed=7)
    assert field_bench.repeats(plans, done) == said.format(2) + "1 do not: corr-iid seed 1 fedprox at 90 from round 7"
    done[30][("corr-iid", "fedprox", 1)]["rounds"].append({"round": 31, "test_acc": 0.0, "elapsed_s": 0})
    assert field_bench.repeats(plans, done).endswith("at 90 from round 7"), "the first round that differs"
    # A run that continued its shorter run shares its rounds by construction; one not finished has none.
    done[90][("corr-iid", "fedprox", 1)] = payload(90, changed=7, extended={"run_dir": "elsewhere", "round": 10})
    assert field_bench.repeats(plans, done) == said.format(1) + same
    done[30][("corr-iid", "fedavg", 1)] = None
    assert field_bench.repeats(plans, done) is None
    assert runs.first_unrepeated(payload(90), payload(30)) == 11, "rounds the longer run lacks are not repeated"


def test_the_field_runs_each_budget_in_turn_the_smaller_first_and_the_longer_run_continues_it(
        tmp_path, monkeypatch, capsys):
    calls: list[tuple[int, str | None]] = []

    def fake_run(cfg, overrides):
        config = OmegaConf.to_container(cfg, resolve=True)
        calls.append((config["comm_budget"], config.get("extend_from")))
        return leave_finished_field_run(config)

    monkeypatch.setattr(runs.sim, "run", fake_run)
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedavg"))
    field_bench.main()
    shorter = tmp_path / "bench-field" / "smoke-budget30" / "corr-iid" / "seed1" / "fedavg"
    assert calls == [(30, None), (90, str(shorter))]
    out = capsys.readouterr().out
    assert out.index("at comm_budget=30 ") < out.index("at comm_budget=90 ")
    assert out.count("runs made at commit 7c69eab (1)") == 2


def test_with_several_budgets_a_fedcorr_column_that_took_stages_12_over_takes_them_over_again(tmp_path, monkeypatch):
    calls: list[tuple] = []

    def fake_run(cfg, overrides):
        config = OmegaConf.to_container(cfg, resolve=True)
        source, extended = config["strategy"].get("stages12_from"), config.get("extend_from")
        calls.append((config["comm_budget"], config["strategy"]["stage3"], source, extended))
        parent = source or extended
        return leave_finished_field_run(config, CheckpointStore(parent).record().lineage.child(35) if parent else None)

    monkeypatch.setattr(runs.sim, "run", fake_run)
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedcorr", "fedcorr+poc", budgets=("60", "75")))
    field_bench.main()
    plain = str(tmp_path / "bench-field" / "smoke-budget60" / "corr-iid" / "seed1" / "fedcorr")
    # The shorter FedCorr+PoC run took rounds from another run, so it cannot be continued.
    assert calls == [(60, "fedavg", None, None), (60, "poc", plain, None), (75, "fedavg", None, plain),
                     (75, "poc", plain, None)]


@pytest.fixture
def field_jobs(monkeypatch):
    """The launcher's local pool with each job run in its own thread by a stand-in for the ``sim.py``
    process (``leave_finished_field_run``, or exit status 1 for the (budget, column) pairs put in
    ``fail``). It notes each start and end as (event, budget, column, extend_from). The job of 30
    participations of FedProx ends only once a 90 run has started (or after 10 s): a pool that waits
    for every shorter run before the first longer one would keep it the whole 10 s."""
    jobs_module = sys.modules["launch.jobs"]
    events: list[tuple[str, int, str, str | None]] = []
    fail: set[tuple[int, str]] = set()
    longer_started = threading.Event()

    def one(self, job):
        with self.lock:  # composing a config is not thread-safe; the pool makes its steps under this lock
            config = runs.resolved_config(list(job.argv[2:]))
            what = (config["comm_budget"], config["strategy"]["name"], config.get("extend_from"))
            events.append(("start", *what))
        if what[0] == 90:
            longer_started.set()
        if what[:2] == (30, "fedprox"):
            longer_started.wait(timeout=10)
        if what[:2] not in fail:
            leave_finished_field_run(config)
        with self.lock:
            events.append(("end", *what))
        return jobs_module.Finished(job, 1 if what[:2] in fail else 0, 1.0)

    monkeypatch.setattr(jobs_module._LocalRun, "one", one)
    return events, fail


def test_with_jobs_a_longer_run_starts_as_soon_as_its_shorter_run_ended_and_continues_it(
        tmp_path, monkeypatch, field_jobs, capsys):
    events, _ = field_jobs
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedavg", "fedprox", "--jobs", "2"))
    field_bench.main()
    folder = tmp_path / "bench-field" / "smoke-budget30" / "corr-iid" / "seed1"
    # Which of two runs started together notes its start first is the threads' race: compare as sets.
    starts = [event[1:] for event in events if event[0] == "start"]
    assert sorted(starts, key=str) == sorted([(30, "fedavg", None), (30, "fedprox", None),
                                              (90, "fedavg", str(folder / "fedavg")),
                                              (90, "fedprox", str(folder / "fedprox"))], key=str)
    # Each longer run starts after its own shorter run ended, and 90 FedAvg before 30 FedProx ended.
    for budget, column, extend_from in [start for start in starts if start[0] == 90]:
        assert events.index(("end", 30, column, None)) < events.index(("start", budget, column, extend_from))
    assert events.index(("start", 90, "fedavg", str(folder / "fedavg"))) < events.index(("end", 30, "fedprox", None))
    out = capsys.readouterr().out
    assert out.index("at comm_budget=30 ") < out.index("at comm_budget=90 ")
    assert "time saved: " in out


def test_with_jobs_a_lone_longer_budget_takes_stages_12_from_the_shorter_run_without_waiting(
        tmp_path, monkeypatch, capsys):
    # The 60 runs first, one after the other: FedCorr+PoC takes its stages 1-2 over from plain FedCorr.
    def fake_run(cfg, overrides):
        config = OmegaConf.to_container(cfg, resolve=True)
        parent = config["strategy"].get("stages12_from")
        return leave_finished_field_run(config, CheckpointStore(parent).record().lineage.child(35) if parent else None)

    monkeypatch.setattr(runs.sim, "run", fake_run)
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedcorr", "fedcorr+poc", budgets=("60",)))
    field_bench.main()
    # Then --budget 75 alone with --jobs 2. Plain FedCorr continues its 60 run, whose stage-2 checkpoint
    # is on disk from the start: FedCorr+PoC takes them from there at once. The plain run ends only once
    # the PoC run has started (or after 10 s, when the PoC run would have waited for it).
    jobs_module = sys.modules["launch.jobs"]
    events: list[tuple[str, str, str | None, str | None]] = []
    poc_started = threading.Event()

    def one(self, job):
        with self.lock:
            config = runs.resolved_config(list(job.argv[2:]))
            what = (config["strategy"]["stage3"], config["strategy"].get("stages12_from"), config.get("extend_from"))
            events.append(("start", *what))
        if what[0] == "poc":
            poc_started.set()
        else:
            poc_started.wait(timeout=10)
        leave_finished_field_run(config)
        with self.lock:
            events.append(("end", *what))
        return jobs_module.Finished(job, 0, 1.0)

    monkeypatch.setattr(jobs_module._LocalRun, "one", one)
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedcorr", "fedcorr+poc", "--jobs", "2",
                                                "--reuse", budgets=("75",)))
    field_bench.main()
    plain60 = str(tmp_path / "bench-field" / "smoke-budget60" / "corr-iid" / "seed1" / "fedcorr")
    assert events.index(("start", "poc", plain60, None)) < events.index(("end", "fedavg", None, plain60))
    assert len(events) == 4
    assert "runs its own stages 1-2" not in capsys.readouterr().out


def test_with_jobs_a_sigterm_stops_the_bench_before_any_other_run_with_its_own_status(tmp_path, monkeypatch,
                                                                                      capsys):
    jobs_module = sys.modules["launch.jobs"]
    started: list[str] = []

    def one(self, job):
        started.append(job.name)
        os.kill(os.getpid(), signal.SIGTERM)  # ``kill <bench>``, or a scheduler's stop, while a run is on
        return jobs_module.Finished(job, 143, 1.0)

    monkeypatch.setattr(jobs_module._LocalRun, "one", one)
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedavg", "--jobs", "2"))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        runs.main_with_clear_errors(field_bench.main)
    assert stop.value.code == 143
    assert len(started) == 1, "the longer run, which waits for the stopped one, never starts"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "stopped by SIGTERM: the same command with --reuse continues each unfinished run from its last checkpoint")
    assert signal.getsignal(signal.SIGTERM) is before


def test_with_jobs_a_failed_run_stops_only_the_runs_that_wait_for_it(tmp_path, monkeypatch, field_jobs, capsys):
    events, fail = field_jobs
    fail.add((30, "fedprox"))
    monkeypatch.setattr(sys, "argv", field_argv(tmp_path, "--columns", "fedavg", "fedprox", "--jobs", "2"))
    with pytest.raises(SystemExit) as stop:
        runs.main_with_clear_errors(field_bench.main)
    assert stop.value.code == 1
    folder = tmp_path / "bench-field"
    assert sorted(event[1:3] for event in events if event[0] == "start") == [(30, "fedavg"), (30, "fedprox"),
                                                                             (90, "fedavg")]
    assert capsys.readouterr().err.splitlines() == [
        f"error: the run of {folder / 'smoke-budget30/corr-iid/seed1/fedprox'} exited with status 1 "
        "(its lines above; --reuse resumes it)",
        f"error: the run of {folder / 'smoke-budget90/corr-iid/seed1/fedprox'} did not start: "
        "a run it waits for failed"]
    assert (folder / "smoke-budget90/corr-iid/seed1/fedavg/results.json").exists()
