"""Running the project's own command lines from tests, as a user would."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def sim(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python sim.py <overrides>`` in the repository; its output captured."""
    return subprocess.run([sys.executable, "sim.py", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def report(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python report.py <args>`` in the repository; its output captured."""
    return subprocess.run([sys.executable, "report.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
