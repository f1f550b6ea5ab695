"""Resume end to end, a Hydra multirun: ``sim.py -m`` on Ray killed with SIGKILL in its first job (it,
its process group and so Ray's processes), then the same command with ``resume=true``: the first job
resumes from its checkpoint, the second runs from round 0, and both end exactly as uninterrupted
runs with the same seeds."""

from __future__ import annotations

import json
from pathlib import Path

import inprocess
import pytest
from kills import (
    ONE_EPOCH,
    assert_resumed,
    assert_same_outputs,
    killed_with_rounds_to_redo,
    read_rounds,
    sim_killed,
    sim_ok,
)

from server.checkpoints import CheckpointStore

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
