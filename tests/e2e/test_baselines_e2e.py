"""FedProx, FedDyn, FedMedian, Power-of-Choice and FedLSR end to end on the smoke preset, through the
real Flower simulation engine on Ray, as one Hydra multirun, its jobs two at a time (a serial multirun
is tests/e2e/test_sim_e2e.py). (As FedCorr's stage 3, and each of their
mechanics, they are tested in the in-process tier: test_fedcorr_stages.py, test_baselines.py,
test_learners.py.)"""

import json

import pytest
from commands import sim

METHODS = ["fedprox", "feddyn", "fedmedian", "poc", "fedlsr"]
ROUNDS, PER_ROUND, POOL, CLIENTS = 3, 3, 6, 10  # smoke: 10 clients, fraction 0.3, PoC pool d = 6


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines")
    # "++": Hydra checks a multirun's overrides against the default strategy (FedCorr, no num_rounds) first.
    done = sim("-m", "--jobs", "2", "experiment=smoke", f"strategy={','.join(METHODS)}",
               f"++strategy.num_rounds={ROUNDS}", f"out_dir={out}/${{strategy.name}}", f"hydra.sweep.dir={out}/sweep",
               timeout=600)
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
    # Ten classes: chance is 0.1. FedLSR's bounded loss (cross-entropy of probabilities used as logits)
    # takes small steps at the smoke lr, so three rounds take it less far.
    assert payload["summary"]["best_acc"] > (0.2 if name == "fedlsr" else 0.3)


def test_poc_counts_its_loss_queries_apart_from_the_budget(standalone):
    assert standalone["poc"]["poc"] == {"d": POOL, "loss_queries": ROUNDS * POOL}
    assert all("poc" not in standalone[name] for name in METHODS if name != "poc")
