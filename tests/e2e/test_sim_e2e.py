"""End to end through the real Flower simulation engine on Ray (the smoke preset: digits, 10 clients)."""

import csv
import json
import time

import inprocess
from commands import report, sim


def test_a_multirun_writes_the_results_contract_and_the_same_seed_gives_the_same_result(tmp_path):
    # One Hydra multirun of two smoke FedAvg runs (one Ray each, in this process, one after the other).
    smoke = ["experiment=smoke", "strategy=fedavg"]
    sweep = sim("-m", *smoke, "seed=3,6", f"out_dir={tmp_path}/s${{seed}}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert sweep.stdout.count("[round   10/10] fedavg") == 2 and sweep.stdout.count("results:") == 2
    # Each job names itself as it starts, by what its sweep changes.
    assert [line for line in sweep.stdout.splitlines() if line.startswith("[job ")] == [
        "[job 1/2] seed=3", "[job 2/2] seed=6"]
    out = tmp_path / "s3"
    payload = json.loads((out / "results.json").read_text())
    assert payload["complete"] is True
    assert payload["config"]["dataset"]["name"] == "digits" and payload["config"]["seed"] == 3
    rounds = payload["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 11))
    assert all(r["stage"] == "fedavg" and len(r["clients"]) == 3 and set(r["clients"]) <= set(range(10))
               for r in rounds)
    assert [r["comm_cost"] for r in rounds] == [3 * k for k in range(1, 11)]
    assert all(0.0 <= r["test_acc"] <= 1.0 and r["test_loss"] > 0 for r in rounds)
    summary = payload["summary"]
    assert summary["best_acc"] == max(r["test_acc"] for r in rounds)
    assert rounds[summary["best_round"] - 1]["test_acc"] == summary["best_acc"]
    # Provenance: the command as typed (the whole multirun), this job's overrides, the code and software.
    (origin,) = payload["provenance"]
    assert origin["command"].split()[0].endswith("sim.py") and "seed=3,6" in origin["command"]
    assert "seed=3" in origin["overrides"].split() and origin["versions"]["flwr"]
    assert len(origin["git"]["commit"]) == 40, "the tests run in a git checkout"
    assert summary["final_acc"] == rounds[-1]["test_acc"] and summary["comm_cost"] == 30
    assert summary["best_acc"] > 0.6, "ten classes: chance is 0.1"
    assert summary["wall_s"] > 0
    with open(out / "rounds.csv") as table:
        assert len(list(csv.DictReader(table))) == 10
    # The same seed again, in this process over the test grid (tests/inprocess.py: what sim.py computes).
    inprocess.run([*smoke, "seed=3", f"out_dir={tmp_path}/again"])
    runs = {name: json.loads((tmp_path / name / "results.json").read_text())["rounds"]
            for name in ("s3", "s6", "again")}
    strip = [{k: r[k] for k in ("clients", "test_acc", "test_loss", "train_loss")} for r in runs["s3"]]
    assert strip == [{k: r[k] for k in ("clients", "test_acc", "test_loss", "train_loss")} for r in runs["again"]]
    assert [r["clients"] for r in runs["s3"]] != [r["clients"] for r in runs["s6"]]
    # The sweep folder lists its jobs, so report.py reads the multirun as one group of two seeds.
    done = report(str(tmp_path / "sweep"), "--out", str(tmp_path / "report"))
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "report" / "table-digits.md").read_text().splitlines()
    assert len(table) == 3 and "| fedavg | 2 | 3 6 |" in table[2]


def test_bad_overrides_fail_before_ray_starts(tmp_path):
    for override, message, code in [
        ("noise.rho=2", "noise.rho=2 is invalid", 2),
        ("strategy.fraction=0", "strategy.fraction=0 is invalid", 2),
        ("strategy.train.lr=-1", "lr=-1", 2),
        ("strategy=fedsgd", "strategy='fedsgd' is invalid: allowed are fedavg", 2),  # a group option, before Hydra
    ]:
        start = time.monotonic()
        done = sim("experiment=smoke", "strategy=fedavg", override, f"out_dir={tmp_path}/bad")
        assert done.returncode == code, (override, done.stderr[-2000:])
        assert message in done.stderr, (override, done.stderr[-2000:])
        assert "ray" not in done.stderr.lower() and time.monotonic() - start < 60
        assert not (tmp_path / "bad").exists(), "bad input leaves nothing behind"
