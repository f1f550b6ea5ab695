"""A benchmark stopped mid-run resumes it, and FedCorr's columns share stages 1-2, end to end:
bench/strategies_fmnist.py on the smoke scene (digits, 10 clients) with two FedCorr columns, T1 = 1 and
T2 = 2 (stages 1-2: 12 rounds, 16 participations) and 2 rounds of stage 3, as a process of its own whose
simulations run over the test grid (``tests/inprocess.py --bench``: the real server and client code
without Ray, which computes what the Ray simulation computes; killing ``sim.py`` and its Ray processes
and resuming it is tests/e2e/test_resume_multirun_e2e.py). The bench is SIGKILLed (its own process group) once
the first FedCorr run wrote a checkpoint, rerun with --reuse, and the column that took stages 1-2 over
is compared with the same column run from round 0. (The bench's logic is tested with a stand-in for
the runs in tests/test_bench_runs.py.)"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import inprocess
import pytest
from commands import REPO

BENCH = REPO / "bench" / "strategies_fmnist.py"
COLUMNS = ["fedcorr+feddyn", "fedcorr+poc"]
BUDGET = 22
# Small FedCorr: stage 1 is 10 one-client rounds, stage 2 two rounds of 3; a checkpoint every 2 rounds.
OVERRIDES = ["strategy.t1=1", "strategy.t2=2", "server.checkpoint_every=2"]
STAGE2_END = 12
ROUND_KEYS = ("round", "stage", "test_acc", "test_loss", "clients", "comm_cost", "train_loss")


def load_strategies_bench():
    # bench/ is not a package and its data.py would shadow ours: load the scripts by path, under the
    # names they import each other by (as tests/test_bench_runs.py does).
    for name in ("runs", "strategies_fmnist"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    return sys.modules["strategies_fmnist"]


def bench_command(outputs: Path) -> list[str]:
    return [sys.executable, inprocess.__file__, "--bench", str(BENCH), "--experiment", "smoke", "--rhos", "0.4",
            "--budget", str(BUDGET), "--methods", *COLUMNS, "--outputs", str(outputs), "--reuse", "--", *OVERRIDES]


def checkpoint_rounds(out_dir: Path) -> list[int]:
    folder = out_dir / "checkpoints"
    names = [path.name for path in folder.glob("round-*.ckpt")] if folder.is_dir() else []
    return sorted(int(name.split("-")[1].split(".")[0]) for name in names)


def lineage(out_dir: Path) -> dict:
    return json.loads((out_dir / "checkpoints" / "run.json").read_text())["lineage"]


def computed(payload: dict) -> dict:
    """What a run computed: every round but its wall time, and every block but the config, the summary,
    ``attempts`` (how the run got there: resumed, or its stages 1-2 taken over) and ``provenance`` (when
    and how each attempt started)."""
    rounds = [{key: row[key] for key in ROUND_KEYS} for row in payload["rounds"]]
    bookkeeping = ("config", "summary", "rounds", "attempts", "provenance")
    blocks = {key: value for key, value in payload.items() if key not in bookkeeping}
    summary = {key: value for key, value in payload["summary"].items() if key != "wall_s"}
    return {"rounds": rounds, "summary": summary, **blocks}


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    """Run the bench, kill it mid-run, rerun it with --reuse; then run one column from round 0."""
    root = tmp_path_factory.mktemp("bench-resume")
    outputs = root / "outputs"
    bench = load_strategies_bench()
    plan = bench.plan_cells(["0.4"], "0.5", BUDGET, "smoke", COLUMNS, OVERRIDES, str(outputs))
    dirs = {column: Path(overrides[-1].removeprefix("out_dir=")) for (_, column), overrides in plan.items()}
    # The first FedCorr column the bench runs does stages 1-2; the other takes them over.
    source, other = sorted(COLUMNS, key=bench.COLUMNS.index)

    log = open(root / "killed.log", "w")
    killed = subprocess.Popen(bench_command(outputs), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any(checkpoint_rounds(folder) for folder in dirs.values()):
            assert killed.poll() is None, (root / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(killed.pid, signal.SIGKILL)  # the bench and whatever it started: its own group only
        except ProcessLookupError:  # it ended by itself (the assertion above says how)
            pass
        killed.wait()
        log.close()
    assert not checkpoint_rounds(dirs[other]), "the bench ran the column that takes stages 1-2 over first"
    killed_at = checkpoint_rounds(dirs[source])[-1]

    rerun = subprocess.run(bench_command(outputs), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    payloads = {column: json.loads((folder / "results.json").read_text()) for column, folder in dirs.items()}
    # The column run from round 0.
    inprocess.run([*plan["0.4", other][:-1], f"out_dir={root / 'scratch'}"])
    return {"dirs": dirs, "source": source, "other": other, "killed_at": killed_at, "stdout": rerun.stdout,
            "payloads": payloads, "scratch": json.loads((root / "scratch" / "results.json").read_text())}


def test_the_killed_bench_resumes_its_run_from_the_checkpoint(bench_runs):
    source, killed_at = bench_runs["source"], bench_runs["killed_at"]
    assert 0 < killed_at < STAGE2_END
    assert f"resuming {bench_runs['dirs'][source]} from round {killed_at}" in bench_runs["stdout"]
    assert lineage(bench_runs["dirs"][source])["resumed_at"] == [killed_at]
    assert bench_runs["payloads"][source]["complete"]


def test_the_other_fedcorr_column_took_stages_12_over_from_the_first(bench_runs):
    dirs, first, other = bench_runs["dirs"], bench_runs["source"], bench_runs["other"]
    source, inherited = lineage(dirs[first]), lineage(dirs[other])
    assert source["parent"] == ""
    assert inherited["parent"] == source["run"] and inherited["parent_round"] == STAGE2_END
    assert inherited["parent_resumed_at"] == [bench_runs["killed_at"]]
    assert bench_runs["payloads"][other]["config"]["strategy"]["stages12_from"] == str(dirs[first])
    assert checkpoint_rounds(dirs[other])[0] > STAGE2_END  # it ran stage 3 only
    stdout = bench_runs["stdout"]
    assert f"{dirs[other]} took them over from {dirs[first]} (round {STAGE2_END})" in stdout
    assert "time saved: " in stdout and "elapsed_s at its stage-2 end round" in stdout


def test_the_inherited_column_computes_what_it_computes_from_round_0(bench_runs):
    payload, scratch = bench_runs["payloads"][bench_runs["other"]], bench_runs["scratch"]
    assert len(scratch["rounds"]) == STAGE2_END + 2 and scratch["summary"]["comm_cost"] == BUDGET
    assert computed(payload) == computed(scratch)
    assert payload["attempts"]["stages12_from"]["round"] == STAGE2_END and scratch["attempts"]["stages12_from"] is None
    assert {key for key in payload if key not in ("config", "summary", "rounds", "complete")} >= {"fedcorr"}
