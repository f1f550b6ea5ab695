"""Running the project's own command lines from tests, as a user would."""

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _processes(keep: Callable[[list[str]], bool]) -> list[int]:
    """The processes whose fields of /proc/<pid>/stat after the command's name (state, parent, group,
    session, ...) ``keep`` accepts."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if keep(fields):
            found.append(int(stat.parent.name))
    return found


def group_alive(group: int) -> list[int]:
    """Processes still running (zombies have ended) in the process group or session ``group``."""
    return _processes(lambda fields: fields[0] != "Z" and group in (int(fields[2]), int(fields[3])))


def alive_after(group: int, seconds: float) -> list[int]:
    """``group_alive(group)`` once the group has gone, or ``seconds`` have passed: a stopped command's
    last processes (Ray's) exit a moment after it."""
    deadline = time.monotonic() + seconds
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    return group_alive(group)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    return _processes(lambda fields: int(fields[1]) == pid)


def sim(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python sim.py <overrides>`` in the repository; its output captured."""
    return subprocess.run([sys.executable, "sim.py", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def report(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python report.py <args>`` in the repository; its output captured."""
    return subprocess.run([sys.executable, "report.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
