"""A benchmark with ``--jobs 2``: its runs as separate ``sim.py`` processes two at a time, a FedCorr run
that shares stages 1-2 started after its source, and each run of a longer budget after the same run
at the shorter one, which it continues; each result equal to the same run made alone from round 0
(the in-process run, which equals the Ray simulation bit for bit)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import inprocess
from commands import REPO, alive_after, children

sys.path.insert(0, str(REPO / "bench"))
from field_fmnist import cell_run  # noqa: E402

COLUMNS = ["fedcorr", "fedcorr+poc"]
BUDGET = 60  # smoke FedCorr: stages 1-2 spend 45 participations, stage 3 five rounds of 3
LONGER = 75  # five more rounds, continuing the runs of BUDGET
EXTRA = ["strategy.train.epochs=1"]  # how runs are launched and shared does not depend on how long clients train


def _rounds(payload: dict) -> list[tuple]:
    return [(r["round"], r["stage"], r["clients"], r["test_acc"], r["train_loss"]) for r in payload["rounds"]]


def test_a_bench_runs_its_runs_two_at_a_time_with_the_results_of_serial_runs(tmp_path):
    done = subprocess.run([sys.executable, "bench/field_fmnist.py", "--experiment", "smoke",
                           "--budget", str(BUDGET), str(LONGER), "--cells", "corr-iid", "--columns", *COLUMNS,
                           "--more-seeds", "--jobs", "2", "--outputs", str(tmp_path), *EXTRA],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {column: cell_run("corr-iid", column, 1, BUDGET, "smoke", EXTRA, str(tmp_path)) for column in COLUMNS}
    folder = {column: next(w for w in words if w.startswith("out_dir=")).partition("=")[2]
              for column, words in runs.items()}
    longer = {column: folder[column].replace(f"budget{BUDGET}", f"budget{LONGER}") for column in COLUMNS}
    # Each run went through the launcher, after the run it needs: FedCorr at the longer budget continued
    # its shorter run, and FedCorr+PoC at both budgets took stages 1-2 from the shorter FedCorr run (the
    # shorter FedCorr+PoC run took rounds from another run, so it cannot be continued).
    started = [line for line in done.stdout.splitlines() if "] starting: " in line]
    assert [line.partition("]")[0][1:] for line in started] == [folder["fedcorr"], folder["fedcorr+poc"],
                                                                 longer["fedcorr"], longer["fedcorr+poc"]]
    extended = json.loads((Path(longer["fedcorr"]) / "results.json").read_text())
    short = json.loads((Path(folder["fedcorr"]) / "results.json").read_text())
    assert extended["config"]["extend_from"] == folder["fedcorr"]
    assert _rounds(extended)[:len(_rounds(short))] == _rounds(short)
    assert len(_rounds(extended)) == len(_rounds(short)) + (LONGER - BUDGET) // 3
    longer_poc = json.loads((Path(longer["fedcorr+poc"]) / "results.json").read_text())
    assert longer_poc["config"]["strategy"]["stages12_from"] == folder["fedcorr"]
    shared = json.loads((Path(folder["fedcorr+poc"]) / "results.json").read_text())
    assert shared["config"]["strategy"]["stages12_from"] == folder["fedcorr"]
    alone = inprocess.run([*runs["fedcorr+poc"], f"out_dir={tmp_path / 'alone'}"])
    assert _rounds(shared) == _rounds(alone)
    first = json.loads((Path(folder["fedcorr"]) / "results.json").read_text())
    stages12 = [row for row in _rounds(alone) if row[1] != "usual"]
    assert stages12 and _rounds(first)[:len(stages12)] == stages12, "the source's stages 1-2 are the same rounds"
    assert "time saved:" in done.stdout


GONE_WITHIN = 30  # seconds for a stopped job's last processes (Ray's) to exit, on a loaded machine


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_sigterm_to_a_background_launch_stops_each_job_as_its_own_sigterm_would(tmp_path):
    """A multirun with ``--jobs 2`` started as a script's background job, whose SIGINT every process
    inherits ignored: a SIGTERM to the launcher alone (``kill``, a scheduler's stop) ends each job's
    run cleanly (exit status 143, no process left in its session) instead of after the grace period's
    SIGKILL, each saying after which round it stopped, and the launcher with its own status and line."""
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "sim.py", "-m", "experiment=smoke", "strategy=fedavg",
                                 "strategy.train.epochs=1", "strategy.num_rounds=50", "seed=1,2",
                                 f"out_dir={tmp_path}/s${{seed}}", f"hydra.sweep.dir={tmp_path}/sweep", "--jobs", "2"],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_ignore_sigint)
    jobs: list[int] = []
    try:
        deadline = time.monotonic() + 600
        # Both runs are training (each has printed a round), so each has its Ray to shut down.
        while len(set(re.findall(r"^\[(\d/2 seed=\d)\] \[round", log.read_text(), re.M))) < 2:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        jobs = children(proc.pid)
        assert len(jobs) == 2
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
        text = log.read_text()
        for name in ("1/2 seed=1", "2/2 seed=2"):
            assert f"[{name}] stopped: exit status 143" in text, text[-3000:]
            # The run's own line: where it stopped and how it continues.
            assert re.search(rf"^\[{re.escape(name)}\] stopped by SIGTERM after round \d+; results so far in ", text,
                             re.M), text[-3000:]
        assert text.rstrip().splitlines()[-1].startswith("stopped by SIGTERM: the jobs still running were stopped")
        assert "Traceback" not in text
        for job in jobs:
            assert alive_after(job, GONE_WITHIN) == [], f"processes of job {job} left behind"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for job in jobs:  # each job's session, which its launcher's own stop may not have reached
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job, signal.SIGKILL)
