"""Where a run's results came from: the command, the code's commit, the software and the machine.

results.json keeps one of these per attempt (a resumed run adds one), so a result found months later
still says which command, commit and versions made it, on which CPU or GPU, and when.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchvision", "flwr", "ray", "numpy", "scikit-learn", "hydra-core")
"""The distributions whose versions decide what a run computes or how it runs."""


def provenance(command: str | None, overrides: str | None) -> dict[str, Any]:
    """The record of this attempt. ``command``: the command line that started the run, where the process
    knows it (``sim.py``; a ServerApp started by ``flwr run`` does not, so None); ``overrides``: the
    Hydra overrides the run was composed from."""
    return {
        "command": command,
        "overrides": overrides,
        "git": code_version(PROJECT_ROOT),
        "versions": {"python": platform.python_version(), **package_versions()},
        "host": host(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@functools.cache
def code_version(root: Path) -> dict[str, Any] | None:
    """``{"commit": <sha>, "dirty": <uncommitted changes to tracked files>}`` of the checkout at ``root``,
    None where it is not a git checkout or git is missing. Once per process."""
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(changes.strip())}


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True)
    return done.stdout


def package_versions() -> dict[str, str | None]:
    """The installed version of each of PACKAGES (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def host() -> dict[str, Any]:
    """The machine the server runs on: its name, CPU model and cores, and its CUDA GPUs (none: [])."""
    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return {"name": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(), "gpus": gpus}


def cpu_model() -> str:
    """The CPU's model name (Linux: from /proc/cpuinfo), else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor() or platform.machine()
