"""FedProx, FedDyn, FedMedian and Power-of-Choice end to end on the smoke preset, through the real
Flower simulation engine on Ray: standalone, and as FedCorr's stage 3 (one Hydra multirun each)."""

import json

import pytest

from commands import sim

METHODS = ["fedprox", "feddyn", "fedmedian", "poc"]
ROUNDS, PER_ROUND, POOL, CLIENTS = 3, 3, 6, 10  # smoke: 10 clients, fraction 0.3, PoC pool d = 6


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines")
    # "++": Hydra checks a multirun's overrides against the default strategy (FedCorr, no num_rounds) first.
    done = sim("-m", "experiment=smoke", f"strategy={','.join(METHODS)}", f"++strategy.num_rounds={ROUNDS}",
               f"out_dir={out}/${{strategy.name}}", f"hydra.sweep.dir={out}/sweep", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: json.loads((out / name / "results.json").read_text()) for name in METHODS}


@pytest.fixture(scope="module")
def as_stage3(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage3")
    done = sim("-m", "experiment=smoke", f"strategy.stage3={','.join(METHODS)}", "strategy.t1=1", "strategy.t2=2",
               f"strategy.t3={ROUNDS}", f"out_dir={out}/${{strategy.stage3}}", f"hydra.sweep.dir={out}/sweep",
               timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: json.loads((out / name / "results.json").read_text()) for name in METHODS}


@pytest.mark.parametrize("name", METHODS)
def test_each_strategy_runs_standalone(standalone, name):
    payload = standalone[name]
    assert payload["complete"] and payload["config"]["strategy"]["name"] == name
    rounds = payload["rounds"]
    assert [r["stage"] for r in rounds] == [name] * ROUNDS
    assert all(len(r["clients"]) == PER_ROUND for r in rounds)
    assert payload["summary"]["comm_cost"] == ROUNDS * PER_ROUND
    assert payload["summary"]["best_acc"] > 0.3, "ten classes: chance is 0.1"


def test_poc_counts_its_loss_queries_apart_from_the_budget(standalone):
    assert standalone["poc"]["poc"] == {"d": POOL, "loss_queries": ROUNDS * POOL}
    assert all("poc" not in standalone[name] for name in METHODS if name != "poc")


@pytest.mark.parametrize("name", METHODS)
def test_each_strategy_runs_as_fedcorr_stage3(as_stage3, name):
    payload = as_stage3[name]
    assert payload["complete"] and payload["config"]["strategy"]["stage3"] == name
    stages = [r["stage"] for r in payload["rounds"]]
    # T1 = 1 iteration of single-client rounds, T2 = 2 finetuning rounds, then T3 rounds of stage 3.
    assert stages == ["preprocess"] * CLIENTS + ["finetune"] * 2 + ["usual"] * ROUNDS
    usual = [r for r in payload["rounds"] if r["stage"] == "usual"]
    assert all(len(r["clients"]) == PER_ROUND for r in usual)
    finetune_cost = payload["rounds"][CLIENTS + 1]["comm_cost"] - CLIENTS
    assert payload["summary"]["comm_cost"] == CLIENTS + finetune_cost + ROUNDS * PER_ROUND
    assert "fedcorr" in payload and payload["summary"]["best_acc"] > 0.3
    assert ("poc" in payload) == (name == "poc")
