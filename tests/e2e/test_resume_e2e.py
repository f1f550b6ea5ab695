"""Resume end to end: a real ``sim.py`` killed with SIGKILL mid-run (it and its process group, so Ray's
processes die with it), then the same command with ``resume=true``, must end exactly as an
uninterrupted run with the same seed: every round (but its ``elapsed_s``), the summary (but
``wall_s``), every method block, the confusion matrix and the per-client CSVs byte for byte. Also a
kill during a checkpoint's own write, and a resume whose config changed (refused before any work).

The kill point is found by polling ``rounds.jsonl`` (one line per finished round); each case checks
that a checkpoint was taken before the kill and that rounds after it had to be redone. The
uninterrupted references run in this process over the test grid (``tests/inprocess.py``: the same
server and client code without Ray, which computes what ``sim.py`` computes). What is killed and
resumed is such a child process for each strategy (FedCorr in each of its stages): the checkpoints,
the nodes' saved state and the resume are our code, the same with or without Ray. The multirun is
killed as ``sim.py`` on Ray, its Ray processes with it, and resumed with ``sim.py ... resume=true``."""

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

import inprocess
import numpy as np
import pytest
from commands import REPO, alive_after, sim

from server.checkpoints import Checkpoint, CheckpointStore, Lineage, read_checkpoint

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


def _tail(path: Path) -> str:
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
            assert proc.poll() is None, f"sim.py ended before the kill point:\n{_tail(log)}"
            assert time.monotonic() < deadline, f"no kill point within {SIM_TIMEOUT} s:\n{_tail(log)}"
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
    assert proc.returncode == -signal.SIGKILL, _tail(log)
    assert alive == [], "processes of the killed run still running"
    return read_rounds(watch)


def sim_ok(*args: str) -> subprocess.CompletedProcess:
    done = sim(*args, timeout=SIM_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# -- comparing outputs ------------------------------------------------------------------------------


def _without(row: dict, *keys: str) -> dict:
    return {key: value for key, value in row.items() if key not in keys}


def _csv_rows(path: Path, drop: str) -> list[dict]:
    with open(path, newline="") as table:
        return [_without(row, drop) for row in csv.DictReader(table)]


def assert_same_outputs(out: Path, reference: Path) -> None:
    """The run in ``out`` computed exactly what the run in ``reference`` did."""
    got, want = (json.loads((folder / "results.json").read_text()) for folder in (out, reference))
    assert got["complete"] is True and want["complete"] is True
    want_rounds = [_without(row, "elapsed_s") for row in want["rounds"]]
    assert [_without(row, "elapsed_s") for row in got["rounds"]] == want_rounds
    assert [_without(row, "elapsed_s") for row in read_rounds(out)] == want_rounds, "rounds.jsonl"
    assert _csv_rows(out / "rounds.csv", "elapsed_s") == _csv_rows(reference / "rounds.csv", "elapsed_s")
    assert _without(got["summary"], "wall_s") == _without(want["summary"], "wall_s")
    assert _without(got["config"], "out_dir", "resume") == _without(want["config"], "out_dir", "resume")
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


# -- FedCorr, killed in each of its stages ---------------------------------------------------------

FEDCORR = ("experiment=smoke", "strategy=fedcorr", "strategy.t1=2", "strategy.t2=4", "strategy.t3=6",
           "server.checkpoint_every=3", "seed=1", ONE_EPOCH)
# rounds 1-20 preprocess (2 iterations of 10 one-client rounds), 21-24 finetune, 25-30 usual;
# checkpoints every 3 rounds and at 20 and 24. Each kill lands past a checkpoint and before the next.
FEDCORR_KILLS = [("preprocess", 11), ("finetune", 22), ("usual", 28)]


@pytest.fixture(scope="module")
def fedcorr_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fedcorr") / "reference"
    inprocess.run([*FEDCORR, f"out_dir={out}"])
    stages = [row["stage"] for row in read_rounds(out)]
    assert stages == ["preprocess"] * 20 + ["finetune"] * 4 + ["usual"] * 6
    return out


@pytest.mark.timeout(3600)
def test_fedcorr_killed_in_each_stage_resumes_to_the_same_results(fedcorr_reference, tmp_path):
    """One run killed in stage 1, resumed and killed in stage 2, resumed and killed in stage 3,
    resumed to its end (a child process over the test grid)."""
    out = tmp_path / "run"
    args = [*FEDCORR, f"out_dir={out}"]
    resumed_from = []
    for stage, at in FEDCORR_KILLS:
        more = ["resume=true"] if resumed_from else []
        rows = sim_killed([*args, *more], out,
                          lambda rows, stage=stage, at=at: bool(rows) and rows[-1]["stage"] == stage
                          and rows[-1]["round"] >= at, tmp_path / f"killed-{stage}.log", command=CHILD)
        assert rows[-1]["stage"] == stage
        resumed_from.append(killed_with_rounds_to_redo(out, rows))
    inprocess.run([*args, "resume=true"])
    assert_resumed(out, fedcorr_reference, *resumed_from)
    assert [r for r, stage_end, _ in CheckpointStore(out).files() if stage_end] == [20, 24]


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*")}


@pytest.mark.timeout(900)
def test_resume_with_a_changed_key_is_refused_before_any_work(fedcorr_reference):
    before = _tree(fedcorr_reference)
    done = sim(*FEDCORR, f"out_dir={fedcorr_reference}", "resume=true", "strategy.t3=7", timeout=SIM_TIMEOUT)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]  # one error line, nothing else
    assert lines[0].startswith("error: resume=True is invalid: "), lines
    assert lines[0].endswith("Differing: strategy.t3 (6 -> 7)"), lines  # that key, and only it
    assert _tree(fedcorr_reference) == before, "nothing written"


# -- every other strategy that keeps state, killed once (a child process over the test grid) --------

# strategy: (its overrides, the round whose row triggers the kill), with checkpoints every 3 rounds.
STATEFUL = {
    "feddyn": (["strategy.num_rounds=8"], 5),
    "scaffold": (["strategy.num_rounds=8"], 5),
    "fednoro": (["strategy.num_rounds=8"], 5),  # warm-up: round 1, then detection and distillation
    "feddiv": (["strategy.num_rounds=6"], 14),  # smoke preset: a warm-up of 10 one-client rounds, then 6
    "fedes": (["strategy.num_rounds=8"], 7),  # smoke preset: s1=3, estimation at 4, SeGD 5-8
}


def _stateful_args(name: str) -> list[str]:
    return ["experiment=smoke", f"strategy={name}", *STATEFUL[name][0], "server.checkpoint_every=3", "seed=2",
            ONE_EPOCH]


@pytest.fixture(scope="module", params=sorted(STATEFUL))
def stateful_reference(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param) / "reference"
    inprocess.run([*_stateful_args(request.param), f"out_dir={out}"])
    return request.param, out


@pytest.mark.timeout(2400)
def test_stateful_strategy_killed_mid_run_resumes_to_the_same_results(stateful_reference, tmp_path):
    name, reference = stateful_reference
    at = STATEFUL[name][1]
    out = tmp_path / "run"
    args = [*_stateful_args(name), f"out_dir={out}"]
    rows = sim_killed(args, out, lambda rows: len(rows) >= at, tmp_path / "killed.log", command=CHILD)
    checkpoint_round = killed_with_rounds_to_redo(out, rows)
    # What a kill during a later checkpoint's write leaves: a temporary file, never taken as a checkpoint.
    store = CheckpointStore(out)
    latest = store.latest()
    assert latest is not None
    leftover = store.dir / f".round-{checkpoint_round + 3:07d}.ckpt.k1ll3d.tmp"
    leftover.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    assert store.latest() == latest
    inprocess.run([*args, "resume=true"])
    assert not leftover.exists()
    assert_resumed(out, reference, checkpoint_round)


# -- a multirun killed in its first job --------------------------------------------------------------

MULTIRUN = ("-m", "seed=1,2", "experiment=smoke", "strategy=fedavg", "strategy.num_rounds=6",
            "server.checkpoint_every=2", ONE_EPOCH)


def _multirun_args(folder: Path) -> list[str]:
    return [*MULTIRUN, f"out_dir={folder}/s${{seed}}", f"hydra.sweep.dir={folder}/sweep"]


@pytest.fixture(scope="module")
def multirun_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("multirun-reference")
    for seed in (1, 2):
        inprocess.run([*MULTIRUN[2:], f"seed={seed}", f"out_dir={folder}/s{seed}"])
    return folder


@pytest.mark.timeout(2400)
def test_multirun_killed_in_its_first_job_resumes_every_job(multirun_reference, tmp_path):
    args = _multirun_args(tmp_path)
    rows = sim_killed(args, tmp_path / "s1", lambda rows: len(rows) >= 3, tmp_path / "killed.log")
    checkpoint_round = killed_with_rounds_to_redo(tmp_path / "s1", rows)
    assert read_rounds(tmp_path / "s2") == [], "killed in the first job"
    sim_ok(*args, "resume=true")
    assert_resumed(tmp_path / "s1", multirun_reference / "s1", checkpoint_round)
    record = CheckpointStore(tmp_path / "s2").record()
    assert record is not None and record.lineage.resumed_at == (), "the second job had nothing to resume"
    assert json.loads((tmp_path / "s2" / "results.json").read_text())["attempts"]["resumed_at"] == []
    assert_same_outputs(tmp_path / "s2", multirun_reference / "s2")
    index = (tmp_path / "sweep" / "runs.txt").read_text().splitlines()
    assert index == [str((tmp_path / "s1").resolve()), str((tmp_path / "s2").resolve())]


# -- a kill during the checkpoint write itself ------------------------------------------------------

WRITER = """
import sys
import numpy as np
from server.checkpoints import Checkpoint, CheckpointStore, Lineage

def checkpoint(server_round, weights):
    return Checkpoint(round=server_round, arrays={"w": weights}, strategy={"round": server_round}, log={},
                      generators={}, results={"rounds": []}, lineage=Lineage("writer", (server_round,)))

store = CheckpointStore(sys.argv[1], keep=1)
store.write(checkpoint(3, np.arange(12, dtype=np.float32)), stage_end=False)
print("first written", flush=True)
big = np.ones(75_000_000, dtype=np.float32)  # 300 MB: the write takes long enough to be killed in
print("second starts", flush=True)
store.write(checkpoint(6, big), stage_end=False)
print("second written", flush=True)
"""


@pytest.mark.timeout(600)
def test_a_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    log = tmp_path / "writer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    folder = tmp_path / "checkpoints"
    try:
        deadline = time.monotonic() + 300
        while not list(folder.glob(".round-0000006.ckpt.*.tmp")):
            assert proc.poll() is None, f"the writer ended before its second write:\n{_tail(log)}"
            assert time.monotonic() < deadline, _tail(log)
            time.sleep(0.001)
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "first written" in log.read_text() and "second written" not in log.read_text()
    partial = list(folder.glob(".round-0000006.ckpt.*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size < 300_000_000, "killed mid-write"
    assert not (folder / "round-0000006.ckpt").exists()
    store = CheckpointStore(tmp_path, keep=1)
    first = folder / "round-0000003.ckpt"
    assert store.files() == [(3, False, first)]
    assert store.latest() == first and store.rounds() == (3,)
    checkpoint = read_checkpoint(first)
    assert isinstance(checkpoint, Checkpoint) and checkpoint.round == 3
    assert checkpoint.strategy == {"round": 3} and checkpoint.lineage == Lineage("writer", (3,))
    np.testing.assert_array_equal(checkpoint.arrays["w"], np.arange(12, dtype=np.float32))
    store.remove_partial()
    assert not partial[0].exists()
    assert sorted(path.name for path in folder.iterdir()) == ["round-0000003.ckpt"]
    assert read_checkpoint(first).round == 3
