"""A node's persistent state (corrected labels, kept losses, control variates): versions on disk that a
resumed run reads back exactly as they were at its checkpoint.

Every instruction of a run's rounds carries a ``StateScope`` (``protocol.messages``); the handler
enters it (``enter``) before any plug-in reads or writes state. With a state folder, each record is a
file per version, ``<root>/run-<run>/partition-<k>/<key>/r<round>-a<attempt>.npz``, written
atomically (a kill leaves the previous version, never a half file):

- a read takes the newest version the scope admits: a version written by an earlier attempt after
  the checkpoint a later resume continued from was undone by that resume, and is skipped (and
  removed); a run that starts from another run's stages 1-2 (``scope.parent``) reads the parent's
  version at its checkpoint until it writes its own;
- a write keeps the newest version and, for each checkpoint the server keeps, the newest version at
  or before it; older ones are removed, so the folder holds a few versions per record.

The state folder is the node config's ``state-dir`` (a deployed SuperNode; several nodes may share
one), or ``<out_dir>/client_state`` for a simulated node (node config ``partition-id``, no
``data-path``), next to the server's checkpoints. A deployed node without ``state-dir``, or an
instruction without a scope (a test driving a handler directly), keeps its state in
``context.state`` only: it does not survive the node's process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from common.atomic_files import read_npz, write_npz
from protocol.codec import decode, encode
from protocol.messages import StateScope, read_scope
from protocol.node_state import SIMULATION_STATE_DIR, run_folder

STATE_DIR_KEY = "state-dir"
ANSWERED_KEY = "answered"
"""The record of the last round the node handled an instruction in, and of the version each other
record had then: what ``query.held`` reads back, so the server can tell a node that kept its state
from one whose state folder lost all or part of it."""
_HOLDS = "holds."
"""Prefix of an ``answered`` entry: the round of the version a record had when the node answered."""
_ENTERED = "state-scope"
"""``context.state`` record: the scope (and state folder) of the instruction being handled."""
_ROOT = "root"
_VERSION = re.compile(r"^r(\d+)-a(\d+)\.npz$")


@dataclass(frozen=True)
class Version:
    """One stored version of a record: the round and the attempt that wrote it."""

    round: int
    attempt: int
    path: Path


def attempt_of(resumed_at: tuple[int, ...]) -> int:
    """The attempt a run with these resumes is in: 1, and one more per resume."""
    return len(resumed_at) + 1


def admitted(version: Version, resumed_at: tuple[int, ...]) -> bool:
    """Whether a version survives every resume after the attempt that wrote it: each resume continued
    from its checkpoint round, undoing what earlier attempts wrote after that round."""
    later = resumed_at[version.attempt - 1:]
    return all(version.round <= checkpoint for checkpoint in later)


def versions(folder: Path) -> list[Version]:
    """The versions stored in a record's folder, oldest first (temporary files of a killed write are
    not versions)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _VERSION.match(path.name)
        if match:
            found.append(Version(int(match[1]), int(match[2]), path))
    return sorted(found, key=lambda v: (v.round, v.attempt))


def state_root(context: Context, out_dir: str) -> Path | None:
    """The node's state folder: its ``state-dir``, a simulated node's ``<out_dir>/client_state``, or
    None (a deployed node without ``state-dir``)."""
    config = context.node_config
    if STATE_DIR_KEY in config:
        return Path(str(config[STATE_DIR_KEY])).expanduser()
    if "partition-id" in config and "data-path" not in config:
        return Path(out_dir) / SIMULATION_STATE_DIR
    return None


def enter(context: Context, content: RecordDict, out_dir: str) -> None:
    """Take the scope of the instruction about to be handled (none: state in memory only)."""
    scope = read_scope(content)
    root = state_root(context, out_dir)
    if scope is None or root is None:
        if _ENTERED in context.state:
            del context.state[_ENTERED]
        return
    context.state[_ENTERED] = ConfigRecord({**encode(scope), _ROOT: str(root)})


def _entered(context: Context) -> tuple[Path, StateScope] | None:
    if _ENTERED not in context.state.config_records:
        return None
    record = dict(context.state.config_records[_ENTERED])
    root = Path(str(record.pop(_ROOT)))
    return root, decode(StateScope, ConfigRecord(record), "the node")


def _read(version: Version) -> ArrayRecord:
    try:
        arrays = read_npz(version.path)
    except (OSError, ValueError) as err:
        raise RuntimeError(f"the node's saved state {version.path} is unreadable ({err}); remove it to "
                           "start that client over") from err
    return ArrayRecord({name: Array(value) for name, value in arrays.items()})


def _newest(folder: Path, resumed_at: tuple[int, ...], at_most: int | None = None) -> Version | None:
    admitted_here = [v for v in versions(folder) if admitted(v, resumed_at)
                     and (at_most is None or v.round <= at_most)]
    return admitted_here[-1] if admitted_here else None


def _seen(root: Path, scope: StateScope, key: str, partition_id: int) -> Version | None:
    """The version of ``key`` the scope reads: this run's newest it admits, else the parent's newest up
    to its checkpoint."""
    own = _newest(run_folder(root, scope.run, partition_id) / key, scope.resumed_at)
    if own is not None or not scope.parent:
        return own
    return _newest(run_folder(root, scope.parent, partition_id) / key, scope.parent_resumed_at,
                   at_most=scope.parent_round)


def load_record(context: Context, key: str, partition_id: int) -> ArrayRecord | None:
    """The record under ``key`` as the current instruction's scope sees it; None before it was first
    saved."""
    entered = _entered(context)
    if entered is None:
        return context.state.array_records.get(key)
    version = _seen(*entered, key, partition_id)
    return None if version is None else _read(version)


def save_record(context: Context, key: str, partition_id: int, record: ArrayRecord) -> None:
    """Keep ``record`` under ``key`` as the current round's version, and drop versions nothing needs."""
    entered = _entered(context)
    if entered is None:
        context.state[key] = record
        return
    root, scope = entered
    folder = run_folder(root, scope.run, partition_id) / key
    folder.mkdir(parents=True, exist_ok=True)
    write_npz(folder / f"r{scope.round:07d}-a{attempt_of(scope.resumed_at)}.npz",
              {name: array.numpy() for name, array in record.items()})
    prune(folder, scope)


def prune(folder: Path, scope: StateScope) -> None:
    """Remove the versions no checkpoint and no later read can use: those a resume undid, and those
    superseded both before every kept checkpoint and now."""
    attempt = attempt_of(scope.resumed_at)
    # A later attempt's versions are never this one's to judge: a killed attempt's client that
    # finishes late must not remove what the resumed run wrote.
    stored = [v for v in versions(folder) if v.attempt <= attempt]
    live = [v for v in stored if admitted(v, scope.resumed_at)]
    needed = {live[-1].path} if live else set()
    for checkpoint in scope.keep:
        before = [v for v in live if v.round <= checkpoint]
        if before:
            needed.add(before[-1].path)
    for version in stored:
        if version.path not in needed:
            version.path.unlink(missing_ok=True)


def mark_answered(context: Context, partition_id: int) -> None:
    """Record that the node handled an instruction of the current scope's round, and the round of the
    version of each other record the scope reads then (nothing without a scope: such a node keeps no
    state a later attempt could miss)."""
    entered = _entered(context)
    if entered is None:
        return
    root, scope = entered
    runs = [scope.run, *([scope.parent] if scope.parent else [])]
    keys = {path.name for run in runs for path in run_folder(root, run, partition_id).glob("*") if path.is_dir()}
    held = {key: _seen(root, scope, key, partition_id) for key in sorted(keys - {ANSWERED_KEY})}
    save_record(context, ANSWERED_KEY, partition_id, ArrayRecord({
        "round": _round_array(scope.round),
        **{f"{_HOLDS}{key}": _round_array(version.round) for key, version in held.items() if version is not None}}))


def _round_array(server_round: int) -> Array:
    return Array(np.array([server_round], dtype=np.int64))


def held_round(context: Context, partition_id: int) -> int:
    """The last round up to which the entered scope sees the node's state whole: the last round it
    answered in (this run's versions it admits, else the parent's up to its checkpoint), or, when a
    record it held then has lost that version since (a state folder emptied, moved or partly deleted),
    the round of the version left of it (0: none); 0 when it sees no answer."""
    record = load_record(context, ANSWERED_KEY, partition_id)
    if record is None:
        return 0
    held = int(record["round"].numpy()[0])
    entered = _entered(context)
    if entered is None:  # state in memory only: nothing on disk could have been lost
        return held
    for name in record:
        if name.startswith(_HOLDS):
            version = _seen(*entered, name.removeprefix(_HOLDS), partition_id)
            left = 0 if version is None else version.round
            if left < int(record[name].numpy()[0]):
                held = min(held, left)
    return held


def load_parameter_arrays(context: Context, key: str, partition_id: int,
                          parameters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A plug-in's per-parameter state under ``key`` (FedDyn's correction, SCAFFOLD's control
    variate), one tensor per entry of ``parameters`` (the model's parameters by name, in order; only
    their shapes and dtypes are used): zeros before the plug-in first saved it."""
    record = load_record(context, key, partition_id)
    if record is None:
        return {name: torch.zeros_like(param) for name, param in parameters.items()}
    if sorted(record) != sorted(parameters):
        raise RuntimeError(f"client state {key} holds arrays for parameters {sorted(record)} but the model has "
                           f"{sorted(parameters)}; the model changed during the run")
    return {name: torch.from_numpy(np.array(record[name].numpy())) for name in parameters}


def save_parameter_arrays(context: Context, key: str, partition_id: int, arrays: Mapping[str, torch.Tensor]) -> None:
    """Keep per-parameter state under ``key`` (see ``save_record``)."""
    record = ArrayRecord({name: Array(np.ascontiguousarray(value.detach().cpu().numpy()))
                          for name, value in arrays.items()})
    save_record(context, key, partition_id, record)
