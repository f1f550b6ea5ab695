"""Where nodes keep their persistent state: the layout both sides rely on in a simulation, whose
server prepares the folder its simulated nodes read (``client.state_store`` reads and writes it)."""

from __future__ import annotations

import shutil
from pathlib import Path

SIMULATION_STATE_DIR = "client_state"
"""The folder under a simulated run's out_dir that holds its nodes' state."""


def run_folder(root: Path, run: str, partition_id: int) -> Path:
    """Where run ``run`` keeps one partition's records under a state folder."""
    return root / f"run-{run}" / f"partition-{partition_id}"


def inherit_folder(source_root: Path, root: Path, run: str) -> None:
    """Make run ``run``'s node state under ``source_root`` readable under ``root`` too (hard links
    where the file system allows, else copies): a simulated run that starts from another run's
    stages 1-2 reads its parent's state from its own out_dir. Nothing to do when the parent's nodes
    kept their state elsewhere (deployed nodes read it from their own ``state-dir``)."""
    source = source_root / f"run-{run}"
    if not source.is_dir():
        return
    target = root / f"run-{run}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, copy_function=_link_or_copy)


def _link_or_copy(source: str, target: str) -> None:
    try:
        Path(target).hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)
