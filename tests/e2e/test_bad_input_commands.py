"""Bad input on the real command lines: sim.py, scene.py and export.py print one ``error:`` line and
exit with status 2 before any work (no file or folder written, no Ray started); a runtime that fails
to start ends the process with one line (the in-process table is tests/test_bad_input.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["experiment=smoke"]


def _words(case: str, tmp: Path) -> list[str]:
    return [*SMOKE, *case.replace("{tmp}", str(tmp)).split()]


def _ray_sessions_of(pid: int, since: datetime) -> list[str]:
    """Ray sessions started by process ``pid`` at or after ``since``: Ray names each
    ``session_<local date-time>_<pid of its starter>``. The pid keeps another Ray on the machine (say a
    concurrent test's) from being taken for this command's; the time keeps a session left by an earlier
    process that had the same pid (pids are reused) from being taken for it."""
    root = Path("/tmp/ray")
    found = root.glob(f"session_*_{pid}") if root.exists() else []
    started = [p.name for p in found
               if datetime.strptime("_".join(p.name.split("_")[1:4]), "%Y-%m-%d_%H-%M-%S_%f") >= since]
    return sorted(started)


@pytest.mark.parametrize(("script", "case", "starts"), [
    ("sim.py", "experiment=smok", "experiment='smok'"),
    ("sim.py", "+num_client=5", "num_client=5"),
    ("sim.py", "client.device=cuda:7", "client.device='cuda:7'"),
    ("sim.py", "-m seed=1,2 noise.rho=5", "noise.rho=5"),
    ("sim.py", "+simulation.ray_init_args.foo=1", "simulation.ray_init_args.foo=1"),
    ("scene.py", "out_dir={tmp}", "out_dir="),
    ("export.py", "export.true_labels=maybe", "export.true_labels='maybe'"),
])
def test_the_commands_print_one_error_line_and_exit_2(script, case, starts, tmp_path):
    (tmp_path / "cwd").mkdir()
    (tmp_path / "blocker").write_text("a file where a folder should be")
    since = datetime.now().replace(microsecond=0)
    command = subprocess.Popen([sys.executable, str(REPO / script), *_words(case, tmp_path / "blocker")],
                               cwd=tmp_path / "cwd", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = command.communicate(timeout=120)
    assert command.returncode == 2, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), stderr[-2000:]
    assert list((tmp_path / "cwd").iterdir()) == [] and _ray_sessions_of(command.pid, since) == []


def test_a_runtime_that_fails_to_start_ends_the_process_with_one_error_line(tmp_path):
    # Ray refuses the logging level only while the runtime starts; the ServerApp thread it leaves
    # behind would otherwise keep the process waiting for nodes until its own timeout (120 s).
    done = subprocess.run([sys.executable, str(REPO / "sim.py"), *SMOKE, f"out_dir={tmp_path / 'run'}",
                           "+simulation.ray_init_args.logging_level=NOPE"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: the simulation runtime failed: ValueError: Unknown level"), done.stderr[-2000:]


def test_a_mistake_in_the_overrides_is_refused_before_torch_and_flower_load(tmp_path):
    # Packages named torch and flwr that fail on import, first on the path: sim.py must refuse a key or a
    # group option that does not exist without importing either, and the same blocked imports fail a bad
    # value, which the run's settings check once they are loaded.
    blocked = tmp_path / "blocked"
    for name in ("torch", "flwr"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")]))}

    def sim(case: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO / "sim.py"), *_words(case, tmp_path)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    for case, starts in [("stratgy=fedavg", "stratgy=fedavg"), ("strategy=fedavgg", "strategy='fedavgg'"),
                         ("-m seed=1,2 --jobs 2 strategy.zz=1", "strategy.zz=1")]:
        done = sim(case)
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {starts} is invalid: "), done.stderr[-2000:]
    done = sim("seed=-1")
    assert done.returncode == 1 and "ImportError: torch was imported" in done.stderr, done.stderr[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["blocked"]
