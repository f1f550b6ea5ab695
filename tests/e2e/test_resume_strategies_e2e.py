"""Resume end to end, every strategy that keeps state but FedCorr: each run over the test grid
(``tests/inprocess.py``) in a child process, killed with SIGKILL mid-run, resumed with
``resume=true``, must end exactly as an uninterrupted run with the same seed; a partial checkpoint
left by a kill during a later write is never taken for one."""

from __future__ import annotations

from pathlib import Path

import inprocess
import pytest
from kills import (
    CHILD,
    ONE_EPOCH,
    assert_resumed,
    killed_with_rounds_to_redo,
    sim_killed,
)

from server.checkpoints import CheckpointStore

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
