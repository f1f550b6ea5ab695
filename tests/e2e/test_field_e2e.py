"""FedNoRo, FedDiv and FedES end to end on the smoke preset (conf/preset/smoke_<name>.yaml): through
the real Flower simulation engine on Ray as one Hydra multirun (its jobs two at a time), scored
against the truth; and as a deployment runs them, without ground truth, over the test grid
(tests/inprocess.py: the same server and client code without Ray; `flwr run .` itself, which gives
the ServerApp no ground truth, is tests/e2e/test_flwr_run.py). (Their mechanics are tested in the
in-process tier: test_fednoro.py, test_feddiv.py, test_fedes.py.)"""

import json

import inprocess
import pytest
from commands import sim

METHODS = ["fednoro", "feddiv", "fedes"]
# smoke: 10 clients; FedNoRo 10 rounds of 3 (warm-up 1); FedDiv 10 one-client warm-up rounds, then
# 10 of 3; FedES 3 pre-training rounds of 3, one of all 10, then 6 of 3.
STAGES = {
    "fednoro": ["warmup"] + ["distill"] * 9,
    "feddiv": ["warmup"] * 10 + ["main"] * 10,
    "fedes": ["pretrain"] * 3 + ["estimate"] + ["segd"] * 6,
}
COST = {"fednoro": 30, "feddiv": 40, "fedes": 37}
# One local epoch: the stages, costs and method blocks do not depend on how long clients train, and
# digits are learnt well past chance in one (best accuracy 0.68-0.79 on seed 1 against 0.95-0.97).
ONE_EPOCH = "strategy.train.epochs=1"


def check(payload: dict, name: str, truth: bool) -> None:
    """A finished run of ``name`` with its stages, its cost and its method's block: scored against the
    truth in a simulation (sim.py sets ground_truth=true), the method's own beliefs only without it."""
    assert payload["complete"] and payload["config"]["strategy"]["name"] == name
    assert [r["stage"] for r in payload["rounds"]] == STAGES[name]
    assert payload["summary"]["comm_cost"] == COST[name]
    assert payload["summary"]["best_acc"] > 0.3, "ten classes: chance is 0.1"
    block = payload[name]
    assert isinstance(block["detected_noisy_clients"], list)
    if truth:
        assert block["true_noisy_clients"] and block["detection"] is not None
    else:
        assert "true_noisy_clients" not in block and "detection" not in block


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("field")
    done = sim("-m", "--jobs", "2", "experiment=smoke", f"strategy={','.join(METHODS)}", ONE_EPOCH,
               f"out_dir={out}/${{strategy.name}}", f"hydra.sweep.dir={out}/sweep", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: json.loads((out / name / "results.json").read_text()) for name in METHODS}


@pytest.mark.parametrize("name", METHODS)
def test_each_method_runs_in_the_ray_simulation(simulated, name):
    check(simulated[name], name, truth=True)


@pytest.mark.parametrize("name", METHODS)
def test_each_method_runs_without_ground_truth(tmp_path, name):
    # As a deployment runs it: the server has no ground truth, so nothing is scored.
    check(inprocess.run(["experiment=smoke", f"strategy={name}", ONE_EPOCH, "ground_truth=false",
                         f"out_dir={tmp_path / 'run'}"]), name, truth=False)
