"""Killing a command mid-run and checking what its resume ends with, for the resume tests: a real
``sim.py`` (or a run over the test grid, ``tests/inprocess.py``) killed with SIGKILL, it and its
process group (so Ray's processes die with it), once the rows of its rounds.jsonl say so; and the
outputs of a resumed run against an uninterrupted run with the same seed: every round (but its
``elapsed_s``), the summary (but ``wall_s``), every method block, the confusion matrix and the
per-client CSVs byte for byte."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from commands import REPO, alive_after, sim

from server.checkpoints import CheckpointStore

SIM_TIMEOUT = 1200  # seconds for one sim.py; generous: the machine may be shared
KILL_WAIT = 60  # seconds for the killed process group to be gone
KEEP = 2  # server.keep_checkpoints' default

Rows = list[dict]


# -- running and killing sim.py ---------------------------------------------------------------------


def read_rounds(out: Path) -> Rows:
    """The rows of ``out``/rounds.jsonl: one per finished round (a line without its newline is not)."""
    path = out / "rounds.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def tail(path: Path) -> str:
    """The last 3,000 characters of a log file (empty if there is none)."""
    return path.read_text(errors="replace")[-3000:] if path.is_file() else ""


SIM = ["sim.py"]
# One local epoch in every run here: what a resume must reproduce does not depend on how long clients train.
ONE_EPOCH = "strategy.train.epochs=1"
CHILD = [str(REPO / "tests" / "inprocess.py")]


def sim_killed(args: list[str], watch: Path, due: Callable[[Rows], bool], log: Path, command: list[str] = SIM,
               ) -> Rows:
    """Start ``command args`` (``sim.py``, or ``CHILD``: a run over the test grid) in a session of its
    own, SIGKILL it and its process group as soon as the rows of ``watch``/rounds.jsonl make ``due``
    true, and return the rows it had finished."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *command, *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    group = os.getpgid(proc.pid)
    assert group == proc.pid
    try:
        deadline = time.monotonic() + SIM_TIMEOUT
        while not due(read_rounds(watch)):
            assert proc.poll() is None, f"sim.py ended before the kill point:\n{tail(log)}"
            assert time.monotonic() < deadline, f"no kill point within {SIM_TIMEOUT} s:\n{tail(log)}"
            time.sleep(0.01)
    finally:
        if proc.returncode is None:  # not reaped yet: the pid is still this process's
            os.kill(proc.pid, signal.SIGKILL)
        try:
            os.killpg(group, signal.SIGKILL)  # Ray's GCS, raylet and workers
        except ProcessLookupError:
            pass
        proc.wait()
        alive = alive_after(group, KILL_WAIT)
    assert proc.returncode == -signal.SIGKILL, tail(log)
    assert alive == [], "processes of the killed run still running"
    return read_rounds(watch)


def sim_ok(*args: str) -> subprocess.CompletedProcess:
    done = sim(*args, timeout=SIM_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# -- comparing outputs ------------------------------------------------------------------------------


def without(row: dict, *keys: str) -> dict:
    return {key: value for key, value in row.items() if key not in keys}


def csv_rows(path: Path, drop: str) -> list[dict]:
    with open(path, newline="") as table:
        return [without(row, drop) for row in csv.DictReader(table)]


def assert_same_outputs(out: Path, reference: Path) -> None:
    """The run in ``out`` computed exactly what the run in ``reference`` did."""
    got, want = (json.loads((folder / "results.json").read_text()) for folder in (out, reference))
    assert got["complete"] is True and want["complete"] is True
    want_rounds = [without(row, "elapsed_s") for row in want["rounds"]]
    assert [without(row, "elapsed_s") for row in got["rounds"]] == want_rounds
    assert [without(row, "elapsed_s") for row in read_rounds(out)] == want_rounds, "rounds.jsonl"
    assert csv_rows(out / "rounds.csv", "elapsed_s") == csv_rows(reference / "rounds.csv", "elapsed_s")
    assert without(got["summary"], "wall_s") == without(want["summary"], "wall_s")
    assert without(got["config"], "out_dir", "resume") == without(want["config"], "out_dir", "resume")
    # "attempts" and "provenance" are bookkeeping: the checkpoint rounds the run resumed from
    # (assert_resumed checks them), and when and how each attempt started
    bookkeeping = {"complete", "config", "rounds", "summary", "attempts", "provenance"}
    blocks = set(got) - bookkeeping
    assert blocks == set(want) - bookkeeping
    assert "test_confusion" in blocks
    for block in sorted(blocks):  # test_confusion and the method's own (fedcorr, scaffold, ...)
        assert got[block] == want[block], block
    tables = sorted(path.name for path in reference.glob("*.csv") if path.name != "rounds.csv")
    assert sorted(path.name for path in out.glob("*.csv") if path.name != "rounds.csv") == tables
    for name in tables:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def assert_resumed(out: Path, reference: Path, *checkpoint_rounds: int) -> None:
    """``out`` was resumed from its checkpoints of ``checkpoint_rounds`` in turn, left no partial
    checkpoint, keeps at most ``KEEP`` periodic checkpoints and ended as ``reference``."""
    store = CheckpointStore(out)
    record = store.record()
    assert record is not None and record.lineage.resumed_at == checkpoint_rounds
    attempts = json.loads((out / "results.json").read_text())["attempts"]
    assert attempts == {"resumed_at": list(checkpoint_rounds), "stages12_from": None, "extended_from": None}
    assert json.loads((reference / "results.json").read_text())["attempts"]["resumed_at"] == []
    assert list(store.dir.glob(".*.tmp")) == []
    assert len([path for _, stage, path in store.files() if not stage]) <= KEEP
    assert [(r, stage) for r, stage, _ in store.files()] == [(r, stage) for r, stage, _ in
                                                                 CheckpointStore(reference).files()]
    assert_same_outputs(out, reference)


def killed_with_rounds_to_redo(out: Path, rows: Rows) -> int:
    """The round of the checkpoint a resume of the killed run in ``out`` continues from; checks that
    the run was cut short after it (rounds to redo)."""
    assert not json.loads((out / "results.json").read_text())["complete"]
    rounds = CheckpointStore(out).rounds()
    assert rounds, "a checkpoint before the kill"
    assert rounds[-1] < len(rows), (rounds, len(rows))
    return rounds[-1]
