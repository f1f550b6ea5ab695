"""Resuming benchmarks (bench/runs.py): a finished run is reused only when its config is the same, and
a finished run with another config is never overwritten by --reuse. And the strategy bench's cells
(bench/strategies_fmnist.py, bench/fedcorr_ablation.py) compose into the configs their columns name, and
the FedCorr bench's summaries over seeds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
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
strategies_bench = load_bench("strategies_fmnist")
fedcorr_bench = load_bench("fedcorr_fmnist")
ablation_bench = load_bench("fedcorr_ablation")


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
    assert runs.differing_keys(old, new) == ["added", "b.d", "b.e", "gone"]


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
