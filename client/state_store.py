"""Client state that outlives the SuperNode process: records in ``context.state`` mirrored on disk.

Flower keeps ``context.state`` in the SuperNode's memory, so a node that restarts mid-run would lose
the labels FedCorr corrected (and FedDyn's correction term). When the node's config names a
``state-dir``, every stored record is also written there (atomically: a crash leaves the previous
file, never a half one) and read back when the fresh process's ``context.state`` lacks it. Files are
per run and partition, so a new run never starts from an old run's labels, and several nodes may
share one directory. Without ``state-dir`` (a simulation) the state lives in memory only.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Array, ArrayRecord, Context

from common.atomic_files import read_npz, write_npz

STATE_DIR_KEY = "state-dir"


def _state_file(context: Context, key: str, partition_id: int) -> Path | None:
    if STATE_DIR_KEY not in context.node_config:
        return None
    root = Path(str(context.node_config[STATE_DIR_KEY])).expanduser()
    return root / f"run-{context.run_id}" / f"partition-{partition_id}" / f"{key}.npz"


def load_record(context: Context, key: str, partition_id: int) -> ArrayRecord | None:
    """The record under ``key``: from ``context.state``, else from the node's disk; None if neither has it."""
    if key in context.state.array_records:
        return context.state.array_records[key]
    path = _state_file(context, key, partition_id)
    if path is None or not path.is_file():
        return None
    try:
        arrays = read_npz(path)
    except (OSError, ValueError) as err:
        raise RuntimeError(f"the node's saved state {path} is unreadable ({err}); remove it to start over") from err
    record = ArrayRecord({name: Array(value) for name, value in arrays.items()})
    context.state[key] = record
    return record


def save_record(context: Context, key: str, partition_id: int, record: ArrayRecord) -> None:
    """Keep ``record`` under ``key`` in ``context.state`` and, with a ``state-dir``, on the node's disk."""
    context.state[key] = record
    path = _state_file(context, key, partition_id)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_npz(path, {name: array.numpy() for name, array in record.items()})
