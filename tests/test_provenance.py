"""results.json's provenance: which command, commit and software made a run, on which machine, when."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from importlib import metadata
from pathlib import Path

import torch

from server.provenance import PROJECT_ROOT, code_version, cpu_model, provenance


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_the_commit_and_whether_tracked_files_changed_since(tmp_path):
    """A clean checkout is not dirty; an edit to a tracked file makes it dirty; an untracked file (a
    run's outputs, say) does not; a folder outside git has no code version."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "a.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert code_version.__wrapped__(repo) == {"commit": sha, "dirty": False}
    (repo / "outputs.txt").write_text("a run's output\n")
    assert code_version.__wrapped__(repo) == {"commit": sha, "dirty": False}
    (repo / "a.py").write_text("x = 2\n")
    assert code_version.__wrapped__(repo) == {"commit": sha, "dirty": True}
    (tmp_path / "plain").mkdir()
    assert code_version.__wrapped__(tmp_path / "plain") is None


def test_a_record_names_the_command_the_software_and_the_machine():
    before = datetime.now(timezone.utc).replace(microsecond=0)
    record = provenance("sim.py experiment=smoke seed=2", "experiment=smoke seed=2")
    assert record["command"] == "sim.py experiment=smoke seed=2" and record["overrides"] == "experiment=smoke seed=2"
    assert record["versions"]["torch"] == metadata.version("torch") and torch.__version__.startswith(
        record["versions"]["torch"].split("+")[0])
    assert record["versions"]["flwr"] == metadata.version("flwr")
    assert record["versions"]["python"].count(".") == 2
    assert record["git"] == code_version(PROJECT_ROOT)
    started = datetime.fromisoformat(record["started"])
    assert started.tzinfo is not None and before <= started <= before + timedelta(minutes=5)
    assert record["host"]["cores"] >= 1 and record["host"]["cpu"] == cpu_model() != ""
    assert record["host"]["gpus"] == ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                                      if torch.cuda.is_available() else [])
