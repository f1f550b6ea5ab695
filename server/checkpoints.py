"""A run's checkpoints: what the server needs to continue a killed run exactly where it stood.

``<out_dir>/checkpoints/`` holds ``run.json`` (the resolved config and the run's ``Lineage``,
written when the run starts) and one file per checkpoint, ``round-<r>.ckpt`` (periodic) or
``round-<r>-stage.ckpt`` (the end of a stage: kept for good, so a later run may start from a finished
run's stages 1-2). A checkpoint is one pickle of a plain dict (``Checkpoint``): the global arrays as
NumPy, the strategy's ``state()``, the run log, every random generator's state and the results
writer's rounds. It is written to a temporary file and renamed, so a kill during the write leaves
the previous checkpoints as they were. Only the latest ``keep`` periodic checkpoints stay.

The nodes' state is not in the file: each node keeps versions of its own (``client.state_store``;
a simulated run's under ``<out_dir>/client_state``), and the round a checkpoint was taken after says
which version each node resumes from. Checkpoints are pickles: load only those your runs wrote.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import secrets
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from common.atomic_files import write_json_atomic
from protocol.messages import StateScope

CHECKPOINTS = "checkpoints"
RUN_RECORD = "run.json"
FORMAT = 1
_NAME = re.compile(r"^round-(\d+)(-stage)?\.ckpt$")


@dataclass(frozen=True)
class Lineage:
    """Which run this is, as the nodes' state versions know it.

    run: the run's key, drawn when it starts afresh and kept across its resumes.
    resumed_at: the checkpoint round each resume continued from, in order.
    parent, parent_round, parent_resumed_at: the run whose checkpoint this run started from
        (``strategy.stages12_from``), that checkpoint's round and the parent's resumes ("" for none).
    """

    run: str
    resumed_at: tuple[int, ...] = ()
    parent: str = ""
    parent_round: int = 0
    parent_resumed_at: tuple[int, ...] = ()

    @classmethod
    def fresh(cls) -> Lineage:
        """A new run's lineage. Its key only names the nodes' state folders, so it is drawn
        independently of the run's seed: two runs with one seed must not share node state."""
        return cls(secrets.token_hex(8))

    def resumed(self, checkpoint_round: int) -> Lineage:
        """The lineage of the next attempt, resumed from the checkpoint of ``checkpoint_round``."""
        return Lineage(self.run, (*self.resumed_at, checkpoint_round), self.parent, self.parent_round,
                       self.parent_resumed_at)

    def child(self, checkpoint_round: int) -> Lineage:
        """A new run that starts from this run's checkpoint of ``checkpoint_round``."""
        return Lineage(secrets.token_hex(8), parent=self.run, parent_round=checkpoint_round,
                       parent_resumed_at=self.resumed_at)

    def scope(self, server_round: int, keep: tuple[int, ...]) -> StateScope:
        """The state scope of the instructions of ``server_round``."""
        return StateScope(self.run, server_round, self.resumed_at, keep, self.parent, self.parent_round,
                          self.parent_resumed_at)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Lineage:
        """The lineage ``asdict`` wrote (lists back to tuples)."""
        return cls(str(values["run"]), tuple(values["resumed_at"]), str(values["parent"]),
                   int(values["parent_round"]), tuple(values["parent_resumed_at"]))


@dataclass
class Checkpoint:
    """What one checkpoint holds (every field plain data, NumPy or the strategy's own objects).

    round: the last round finished; arrays: the global model after it; strategy: ``state()``;
    log: the run log's ``state()``; generators: ``generator_states()``; results: the results
    writer's ``state()``; lineage: the run's lineage when it was taken.
    """

    round: int
    arrays: dict[str, np.ndarray]
    strategy: dict[str, Any]
    log: dict[str, Any]
    generators: dict[str, Any]
    results: dict[str, Any]
    lineage: Lineage
    format: int = field(default=FORMAT)

    def global_arrays(self) -> ArrayRecord:
        """The global model as an ``ArrayRecord``, keys in their original order."""
        return ArrayRecord({name: Array(np.array(value)) for name, value in self.arrays.items()})


def numpy_arrays(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    """An ``ArrayRecord`` as NumPy arrays, in order."""
    return {name: array.numpy() for name, array in arrays.items()}


def generator_states(sampling: np.random.Generator) -> dict[str, Any]:
    """The state of every random generator the server draws from: the run's sampling generator and
    the global ones of torch, NumPy and Python."""
    return {"sampling": sampling.bit_generator.state, "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(), "python": random.getstate()}


def restore_generators(sampling: np.random.Generator, states: dict[str, Any]) -> None:
    """Set every generator back to ``generator_states()`` (the sampling generator in place: the
    strategies share it)."""
    sampling.bit_generator.state = states["sampling"]
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


@dataclass(frozen=True)
class RunRecord:
    """``checkpoints/run.json``: the config a run was started with and its lineage."""

    config: dict[str, Any]
    lineage: Lineage


class CheckpointStore:
    """The checkpoints of the run in ``out_dir``.

    keep: how many of the latest periodic checkpoints to keep (stage ends are always kept).
    """

    def __init__(self, out_dir: str | Path, keep: int = 2) -> None:
        self.dir = Path(out_dir) / CHECKPOINTS
        self.keep = keep

    def files(self) -> list[tuple[int, bool, Path]]:
        """(round, is a stage end, path) of every checkpoint, by round."""
        if not self.dir.is_dir():
            return []
        found = []
        for path in self.dir.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match[1]), bool(match[2]), path))
        return sorted(found)

    def rounds(self) -> tuple[int, ...]:
        """The rounds of the kept checkpoints."""
        return tuple(sorted({checkpoint_round for checkpoint_round, _, _ in self.files()}))

    def latest(self) -> Path | None:
        """The newest checkpoint; None if there is none."""
        files = self.files()
        return files[-1][2] if files else None

    def at(self, checkpoint_round: int) -> Path | None:
        """The checkpoint taken after ``checkpoint_round``; None if it is not kept."""
        return next((path for found, _, path in self.files() if found == checkpoint_round), None)

    def write(self, checkpoint: Checkpoint, stage_end: bool) -> Path:
        """Write ``checkpoint`` atomically, then drop the periodic ones beyond the latest ``keep``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"round-{checkpoint.round:07d}{'-stage' if stage_end else ''}.ckpt"
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as out:
                pickle.dump(asdict_shallow(checkpoint), out, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        periodic = [found for _, stage, found in self.files() if not stage]
        for old in periodic[:-self.keep]:
            old.unlink(missing_ok=True)
        return path

    def clear(self) -> None:
        """Remove every checkpoint and the run record (a fresh run in this folder)."""
        if self.dir.exists():
            shutil.rmtree(self.dir)

    def remove_partial(self) -> None:
        """Remove what a write killed half-way left (temporary files, never a checkpoint)."""
        if self.dir.is_dir():
            for path in self.dir.glob(".*.tmp"):
                path.unlink(missing_ok=True)

    def write_record(self, record: RunRecord) -> None:
        """Write ``run.json``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir / RUN_RECORD, {"format": FORMAT, "config": record.config,
                                                  "lineage": asdict(record.lineage)})

    def record(self) -> RunRecord | None:
        """``run.json``; None if the folder has no run record."""
        path = self.dir / RUN_RECORD
        if not path.is_file():
            return None
        values = json.loads(path.read_text())
        return RunRecord(values["config"], Lineage.from_dict(values["lineage"]))


def asdict_shallow(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint's fields as a dict, values as they are (``asdict`` would copy deep)."""
    return {name: getattr(checkpoint, name) for name in Checkpoint.__dataclass_fields__}


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint in ``path``."""
    with open(path, "rb") as source:
        values = pickle.load(source)  # noqa: S301 - a run's own checkpoint, written by this module
    if values.get("format") != FORMAT:
        raise RuntimeError(f"{path} is a checkpoint of format {values.get('format')}; this version reads "
                           f"format {FORMAT}")
    return Checkpoint(**values)
