"""Client state that outlives the SuperNode process: records in ``context.state`` mirrored on disk.

Flower keeps ``context.state`` in the SuperNode's memory, so a node that restarts mid-run would lose
the labels FedCorr corrected (and FedDyn's correction term). When the node's config names a
``state-dir``, every stored record is also written there (atomically: a crash leaves the previous
file, never a half one) and read back when the fresh process's ``context.state`` lacks it. Files are
per run and partition, so a new run never starts from an old run's labels, and several nodes may
share one directory. Without ``state-dir`` (a simulation) the state lives in memory only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
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
