"""One client's local dataset as one ``.npz`` file: all a node of a real deployment holds.

Arrays:
    images       uint8 (n, C, H, W)
    labels       int64 (n,), the labels the node trains on
    true_labels  int64 (n,), -1 unknown; optional: only rehearsal exports of a simulation scene carry it
                 (so simulation diagnostics still work), a real node has none
    meta         JSON string: format, dataset, classes, mean, std, partition_id
Written with data.npz (same inputs, same bytes; never a half-written file) and read without pickle.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic_files import read_npz, write_npz
from common.errors import ConfigError, SceneError
from data.client_data import ClientData
from data.sources.base import Dataset, ImageArray, Split

LOCAL_FORMAT_VERSION = 1
_REQUIRED = ("images", "labels", "meta")


def check_in_memory(images: ImageArray, dataset_name: str) -> None:
    """Refuse image arrays decoded lazily from files (Clothing1M): they cannot be exported whole."""
    if not isinstance(images, np.ndarray):
        raise ConfigError(
            f"dataset {dataset_name!r} decodes its images lazily from image files and cannot be exported "
            "into local data files; a real node of such a dataset should point at its own image folder, "
            "which the local file format does not cover"
        )


def write_local_file(
    path: str | os.PathLike[str],
    *,
    images: ImageArray,
    labels: np.ndarray,
    classes: tuple[str, ...] | list[str],
    mean: tuple[float, ...] | list[float],
    std: tuple[float, ...] | list[float],
    dataset_name: str,
    partition_id: int,
    true_labels: np.ndarray | None = None,
) -> None:
    """Write one node's data to ``path``; invalid inputs raise ConfigError before anything is written.

    Integer labels of any width are stored as int64; images must already be uint8.
    """
    check_in_memory(images, dataset_name)
    meta = {
        "format": LOCAL_FORMAT_VERSION,
        "dataset": dataset_name,
        "classes": list(classes),
        "mean": list(mean),
        "std": list(std),
        "partition_id": partition_id,
    }
    arrays = {"images": np.asarray(images), "labels": _as_int64(labels)}
    if true_labels is not None:
        arrays["true_labels"] = _as_int64(true_labels)
    try:
        arrays["meta"] = np.array(json.dumps(meta, sort_keys=True, separators=(",", ":"), default=_plain))
        _validate(arrays)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"cannot write local data file {path}: {err}") from err
    write_npz(path, arrays)


def read_local_file(path: str | os.PathLike[str]) -> tuple[Dataset, ClientData, int]:
    """The node's data from ``path``: a Dataset whose train split is the node's data (its test split
    is empty), the ClientData view of it, and the partition id. A bad file raises SceneError."""
    path = Path(path)
    if not path.is_file():
        raise SceneError(
            f"no local data file at {path.absolute()}; write one with data.local_file.write_local_file "
            "or rehearse with `python export.py`"
        )
    try:
        arrays = read_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise SceneError(f"local data file {path} is not a readable .npz archive ({err})") from err
    try:
        meta = _validate(arrays)
    except ValueError as err:
        raise SceneError(f"local data file {path} is invalid: {err}") from err
    images, labels = arrays["images"], arrays["labels"]
    true_labels = arrays.get("true_labels", np.full(labels.shape, -1, dtype=np.int64))
    empty = Split(np.zeros((0, *images.shape[1:]), dtype=np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64))
    dataset = Dataset(meta["dataset"], Split(images, labels, true_labels), empty,
                      tuple(meta["classes"]), tuple(meta["mean"]), tuple(meta["std"]))
    # Own label copies: a client that relabels in place must not rewrite the dataset's labels.
    data = ClientData(images, labels.copy(), true_labels.copy(), np.arange(labels.size, dtype=np.int64))
    return dataset, data, meta["partition_id"]


def _plain(value: Any) -> Any:
    """NumPy scalars (an ``np.int64`` partition id, ``np.float32`` means) as their Python values."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{value!r} of type {type(value).__name__} is not a plain number or string")


def _as_int64(values: np.ndarray) -> np.ndarray:
    array = np.asarray(values)
    return array.astype(np.int64) if array.dtype.kind in "iu" else array


def _validate(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The parsed meta of a well-formed set of arrays; ValueError naming the first problem otherwise."""
    missing = [name for name in _REQUIRED if name not in arrays]
    if missing:
        raise ValueError(f"missing arrays {missing} (needs {', '.join(_REQUIRED)}, optionally true_labels)")
    images = arrays["images"]
    if images.dtype != np.uint8 or images.ndim != 4 or 0 in images.shape[1:]:
        raise ValueError(f"images must be uint8 of shape (n, C, H, W), got {images.dtype} {images.shape}")
    meta = _validate_meta(arrays["meta"], channels=images.shape[1])
    num_classes = len(meta["classes"])
    for name, low in (("labels", 0), ("true_labels", -1)):
        if name not in arrays:
            continue
        values = arrays[name]
        if values.dtype != np.int64 or values.shape != (images.shape[0],):
            raise ValueError(f"{name} must be int64 of shape ({images.shape[0]},) like the images, "
                             f"got {values.dtype} {values.shape}")
        if values.size and (values.min() < low or values.max() >= num_classes):
            raise ValueError(f"{name} hold values in {values.min()}..{values.max()}, "
                             f"allowed are {low}..{num_classes - 1}")
    if images.shape[0] == 0:
        raise ValueError("it holds no samples: a node needs at least one to train on")
    return meta


def _validate_meta(raw: np.ndarray, channels: int) -> dict[str, Any]:
    if raw.dtype.kind != "U" or raw.ndim != 0:
        raise ValueError(f"meta must be a JSON string, got {raw.dtype} {raw.shape}")
    meta = json.loads(str(raw))
    if not isinstance(meta, dict) or meta.get("format") != LOCAL_FORMAT_VERSION:
        raise ValueError(f"meta is not format-{LOCAL_FORMAT_VERSION} local-file meta")
    if not isinstance(meta.get("dataset"), str) or not meta["dataset"]:
        raise ValueError(f"meta dataset={meta.get('dataset')!r} must be a non-empty name")
    classes = meta.get("classes")
    if not isinstance(classes, list) or len(classes) < 2 or not all(isinstance(c, str) for c in classes):
        raise ValueError(f"meta classes={classes!r} must be a list of at least 2 class names")
    for key in ("mean", "std"):
        values = meta.get(key)
        if (not isinstance(values, list) or len(values) != channels
                or not all(isinstance(v, (int, float)) and np.isfinite(v) for v in values)):
            raise ValueError(f"meta {key}={values!r} must be {channels} finite numbers, one per image channel")
    if min(meta["std"]) <= 0:
        raise ValueError(f"meta std={meta['std']!r} must be positive")
    partition_id = meta.get("partition_id")
    if not isinstance(partition_id, int) or isinstance(partition_id, bool) or partition_id < 0:
        raise ValueError(f"meta partition_id={partition_id!r} must be an integer >= 0")
    return meta
