"""Find a dataset's files among candidate directories and explain a miss in one error."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from common.errors import DatasetNotFoundError


def as_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``~`` expanded, so configs may use it."""
    return Path(path).expanduser()


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be searched ("does not exist", "not a directory"), or None for a folder."""
    if path.is_dir():
        return None
    return "not a directory" if path.exists() else "does not exist"


def find_file(directory: Path, name: str, suffixes: Sequence[str] = ("",)) -> Path | None:
    """The first existing ``directory/name<suffix>``, or None."""
    for suffix in suffixes:
        candidate = directory / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def download_hint(download: bool) -> str:
    """How to get a dataset torchvision can download, given whether a download was already tried."""
    if download:
        return "or retry the download above from a machine with network access"
    return "or pass download=True (config: dataset.download=true) to download it with torchvision"


class Lookup:
    """Records every place tried and why it failed, for one ``DatasetNotFoundError``."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._misses: list[str] = []

    def find_all(
        self, directories: Iterable[Path], names: Sequence[str], suffixes: Sequence[str] = ("",)
    ) -> list[Path] | None:
        """The files ``names`` from the first directory holding all of them, or None."""
        for directory in directories:
            problem = folder_problem(directory)
            if problem is not None:
                self.miss(directory, problem)
                continue
            found = [find_file(directory, name, suffixes) for name in names]
            missing = [name for name, path in zip(names, found) if path is None]
            if not missing:
                return [path for path in found if path is not None]
            self.miss(directory, f"missing {', '.join(missing)}")
        return None

    def miss(self, place: Path | str, reason: str) -> None:
        """Note a place that did not hold the dataset, and why, for ``error``."""
        self._misses.append(f"{place}: {reason}")

    def error(self, how_to_get: Sequence[str]) -> DatasetNotFoundError:
        """The error listing every place tried and each way to obtain the data."""
        looked = "\n".join(f"  - {miss}" for miss in self._misses) or "  (nowhere)"
        how = "\n".join(f"  - {step}" for step in how_to_get)
        return DatasetNotFoundError(
            f"dataset {self.dataset!r} not found. Looked in:\n{looked}\nTo get it:\n{how}"
        )
