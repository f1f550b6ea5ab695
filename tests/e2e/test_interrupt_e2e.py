"""Ctrl-C end to end: a real ``sim.py`` on Ray, in a session of its own, gets SIGINT on its whole process
group, as a terminal sends it. The first Ctrl-C must end the command within seconds with status 130
and one line saying where the run stopped and how to continue it, leave no process of the group behind
(Ray's GCS, raylet and workers included), and leave results that read and resume: the same command with
``resume=true`` finishes the run from its latest checkpoint. A second Ctrl-C during the first one's
clean-up does not interrupt it, and a Ctrl-C during Ray's start-up ends the command the same way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from commands import REPO, alive_after, sim

from common.run_files import read_rounds
from server.checkpoints import CheckpointStore

STOP_WITHIN = 30  # seconds from SIGINT to the command's end (Ray's shutdown under a loaded machine)
GONE_WITHIN = 30  # seconds from the command's end until Ray's last process of its group has exited (10 s
                  # were once too few for two of them with the CI suite and two bench runs on 2 cores)
START_TIMEOUT = 600
SMOKE = ["experiment=smoke", "strategy=fedavg", "strategy.train.epochs=1", "strategy.num_rounds=20",
         "server.checkpoint_every=2"]


def interrupted(args: list[str], log: Path, ready: Callable[[str], bool], signals: int = 1,
                terminate: bool = False) -> tuple[subprocess.Popen, float]:
    """Start ``sim.py args``; once ``ready(its output so far)``, send SIGINT to its process group
    ``signals`` times (``terminate``: SIGTERM to the command's own process only, as a container
    runtime stops its main process); returns the ended process and the seconds it took to end."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "sim.py", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    group = proc.pid
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready(log.read_text(errors="replace")):
            assert proc.poll() is None, f"sim.py ended before the interrupt:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready within {START_TIMEOUT} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        sent = time.monotonic()
        for _ in range(signals):
            if terminate:
                os.kill(proc.pid, signal.SIGTERM)
            else:
                os.killpg(group, signal.SIGINT)
            time.sleep(0.2)
        try:
            proc.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {STOP_WITHIN} s after Ctrl-C:\n{log.read_text()[-3000:]}") from None
        took = time.monotonic() - sent
        assert alive_after(group, GONE_WITHIN) == [], f"processes left behind:\n{log.read_text()[-3000:]}"
        return proc, took
    finally:
        if proc.poll() is None:
            os.killpg(group, signal.SIGKILL)
            proc.wait()


def last_line(log: Path) -> str:
    return log.read_text().strip().splitlines()[-1]


def test_ctrl_c_stops_the_run_says_where_and_the_run_resumes_from_there(tmp_path):
    """Two Ctrl-Cs in a row (an impatient user): the second only says that the first is being handled."""
    out = tmp_path / "run"
    args = [*SMOKE, f"out_dir={out}"]
    proc, took = interrupted(args, tmp_path / "log", lambda text: "[round    5/20]" in text, signals=2)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    rounds = [row["round"] for row in read_rounds(out)]
    assert rounds == list(range(1, len(rounds) + 1)) and 5 <= len(rounds) < 20
    assert "stopping: Ray is shutting down" in text
    line = last_line(tmp_path / "log")
    assert line.startswith(f"stopped by Ctrl-C after round {rounds[-1]}; results so far in {out}; "), line
    checkpoint = int(line.split("latest checkpoint is of round ")[1].split(":")[0])
    assert checkpoint <= rounds[-1] and line.endswith("the same command with resume=true continues from there")
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] is False
    print(f"stopped {took:.1f} s after Ctrl-C")  # the figure; the bound is STOP_WITHIN
    done = sim(*args, "resume=true", timeout=START_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    finished = json.loads((out / "results.json").read_text())
    assert finished["complete"] and [row["round"] for row in finished["rounds"]] == list(range(1, 21))
    assert finished["attempts"]["resumed_at"] == [checkpoint]


def test_a_ctrl_c_while_ray_starts_leaves_no_ray_process(tmp_path):
    # The header is printed as the server starts, before the scene is read and Ray is started.
    proc, _ = interrupted([*SMOKE, f"out_dir={tmp_path / 'run'}"], tmp_path / "log",
                          lambda text: "[run] fedavg" in text)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 130 and "Traceback" not in text and "ERROR" not in text, text[-3000:]
    assert last_line(tmp_path / "log").startswith("stopped by Ctrl-C before its first round finished; ")


def test_sigterm_stops_the_run_as_ctrl_c_does_with_its_own_status(tmp_path):
    """A scheduler's SIGTERM (a time limit, a preemption) to the command alone: it ends within seconds
    with status 143 and the same line, no process of its group is left, and the checkpoint the line
    names is there (a resume from it is the Ctrl-C test's)."""
    out = tmp_path / "run"
    args = [*SMOKE, f"out_dir={out}"]
    proc, took = interrupted(args, tmp_path / "log", lambda text: "[round    5/20]" in text, terminate=True)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 143 and "Traceback" not in text and "ERROR" not in text, text[-3000:]
    rounds = [row["round"] for row in read_rounds(out)]
    line = last_line(tmp_path / "log")
    assert line.startswith(f"stopped by SIGTERM after round {rounds[-1]}; results so far in {out}; "), line
    assert line.endswith("the same command with resume=true continues from there"), line
    checkpoint = int(line.split("latest checkpoint is of round ")[1].split(":")[0])
    assert CheckpointStore(out).rounds()[-1] == checkpoint and 4 <= checkpoint <= rounds[-1]
    print(f"stopped {took:.1f} s after SIGTERM")
