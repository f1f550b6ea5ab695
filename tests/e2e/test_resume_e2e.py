"""Resume end to end: a run killed with SIGKILL mid-run, then the same command with ``resume=true``,
must end exactly as an uninterrupted run with the same seed (``kills.assert_resumed``). Here FedCorr
killed in each of its stages, a kill during a checkpoint's own write, and a resume whose config
changed (refused before any work); the other stateful strategies and a ``sim.py`` multirun are in
``test_resume_strategies_e2e.py`` and ``test_resume_multirun_e2e.py`` (files of their own, so that
the e2e tier's workers share them out).

The kill point is found by polling ``rounds.jsonl`` (one line per finished round); each case checks
that a checkpoint was taken before the kill and that rounds after it had to be redone. The
uninterrupted references run in this process over the test grid (``tests/inprocess.py``: the same
server and client code without Ray, which computes what ``sim.py`` computes). What is killed and
resumed is such a child process (FedCorr in each of its stages): the checkpoints, the nodes' saved
state and the resume are our code, the same with or without Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import inprocess
import numpy as np
import pytest
from commands import REPO, sim
from kills import (
    CHILD,
    ONE_EPOCH,
    SIM_TIMEOUT,
    assert_resumed,
    killed_with_rounds_to_redo,
    read_rounds,
    sim_killed,
    tail,
)

from server.checkpoints import Checkpoint, CheckpointStore, Lineage, read_checkpoint

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
            assert proc.poll() is None, f"the writer ended before its second write:\n{tail(log)}"
            assert time.monotonic() < deadline, tail(log)
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
