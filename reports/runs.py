"""Run directories as ``sim.py`` leaves them, read back: results.json, its config and its rounds (from
rounds.jsonl while a run is in progress or was killed), and FedCorr's per-client confusion counts
(confusion.npz).

A path may be one run (it holds results.json), a Hydra multirun folder (its runs.txt lists the jobs'
out_dirs, written by ``sim.py -m``), or any folder with runs below it (bench/ output trees).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import InvalidValue
from common.run_files import RESULTS, read_confusion, read_payload

MULTIRUN_INDEX = "runs.txt"
# Keys that tell runs of one configuration apart without changing it: they are not grouped on.
_NOT_CONFIG = ("seed", "out_dir", "resume")


@dataclass(frozen=True)
class Run:
    """One run directory and its results.json payload."""

    path: Path
    payload: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config the run was made with."""
        return self.payload.get("config") or {}

    @property
    def complete(self) -> bool:
        """Whether the run finished (an unfinished run's rounds so far are still read)."""
        return bool(self.payload.get("complete"))

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """One row per finished round."""
        return list(self.payload.get("rounds") or [])

    @property
    def fedcorr(self) -> dict[str, Any] | None:
        """FedCorr's block (detection, noise estimates, per-iteration LIDs), if the run has one."""
        return self.payload.get("fedcorr")

    @property
    def confusion(self) -> dict[str, dict[str, list[int]]]:
        """Per client (id as a string), its (true label, label held) counts, row-major, at each point
        it reported (``common.run_files.CONFUSION_POINTS``): from confusion.npz, or from the
        ``fedcorr`` block of a results.json written before the counts had a file of their own."""
        inline = (self.fedcorr or {}).get("confusion")
        if isinstance(inline, dict) and "file" not in inline:
            return inline
        return read_confusion(self.path)

    @property
    def method_block(self) -> dict[str, Any] | None:
        """The block the run's own strategy wrote (``fedcorr``, ``fednoro``, ``feddiv``, ``fedes``), if any:
        each holds its ``detection`` scored against the truth the same way."""
        block = self.payload.get(self.strategy)
        return block if isinstance(block, dict) else None

    @property
    def seed(self) -> Any:
        """The run's seed."""
        return self.config.get("seed")

    @property
    def dataset(self) -> str:
        """The dataset's name."""
        return str((self.config.get("dataset") or {}).get("name", "?"))

    @property
    def strategy(self) -> str:
        """The strategy's name."""
        return str((self.config.get("strategy") or {}).get("name", "?"))

    def group_key(self) -> str:
        """The config without seed, out_dir, resume and the run FedCorr's stages 1-2 came from (which
        give the same results): runs with the same key are seeds of one setting."""
        config = {k: v for k, v in self.config.items() if k not in _NOT_CONFIG}
        strategy = {k: v for k, v in (config.get("strategy") or {}).items() if k != "stages12_from"}
        return json.dumps({**config, "strategy": strategy}, sort_keys=True)


def _read(path: Path) -> Run:
    try:
        payload = read_payload(path)
    except (OSError, json.JSONDecodeError) as err:
        raise InvalidValue("RUN_DIR", str(path), f"a readable {RESULTS} ({err})") from None
    if not isinstance(payload, dict) or "rounds" not in payload or "config" not in payload:
        raise InvalidValue("RUN_DIR", str(path), f"a {RESULTS} written by sim.py (config and rounds)")
    return Run(path, payload)


def _listed(folder: Path) -> list[Path]:
    """The run folders a multirun index names (relative entries are relative to the folder)."""
    lines = [line.strip() for line in (folder / MULTIRUN_INDEX).read_text().splitlines() if line.strip()]
    return [Path(line) if Path(line).is_absolute() else folder / line for line in lines]


def find_runs(paths: list[str]) -> list[Run]:
    """Every run under ``paths`` (one run, a multirun folder, or a tree of runs), in the order given,
    each run once. A path with no run in or below it is an error naming it."""
    found: dict[Path, Run] = {}
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            raise InvalidValue("RUN_DIR", given, "an existing run directory (or a folder of runs)")
        if (path / RESULTS).is_file():
            candidates = [path]
        elif (path / MULTIRUN_INDEX).is_file():
            candidates = _listed(path)
        else:
            candidates = sorted(results.parent for results in path.rglob(RESULTS))
        if not candidates:
            raise InvalidValue("RUN_DIR", given, f"a run directory: no {RESULTS} in it or below it "
                                                 "(a run that has not finished its first round has none yet)")
        for candidate in candidates:
            if not (candidate / RESULTS).is_file():
                raise InvalidValue("RUN_DIR", str(candidate), f"a run directory with {RESULTS} "
                                                              f"(listed in {path / MULTIRUN_INDEX})")
            found.setdefault(candidate.resolve(), _read(candidate))
    return list(found.values())
