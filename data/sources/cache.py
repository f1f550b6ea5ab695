"""Decoded dataset arrays cached as ``.npy`` files and reopened memory-mapped.

Decoding a dataset's original files (gzip, pickles, text lists) takes far longer than a simulated
client may spend loading its slice. The decoded arrays are therefore written once per set of source
files and reopened with ``mmap_mode="r"``: every client process shares the same page cache and reads
only the pages of its own samples.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from data.sources.lookup import as_path

CACHE_ENV = "FEDCORR_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/fedcorr-flower/datasets"

# Bump when the decoded layout of any dataset changes, so old entries are never reused.
_FORMAT_VERSION = 1


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$FEDCORR_CACHE_DIR``, else ``DEFAULT_CACHE_DIR``."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR
    return as_path(cache_dir)


def download_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where torchvision downloads go when the caller gives no dataset root."""
    return cache_root(cache_dir) / "downloads"


def cache_key(dataset: str, sources: Sequence[Path]) -> str:
    """A digest of the sources' paths, sizes and mtimes: any change to a source changes the key."""
    identity = []
    for source in sources:
        stat = source.stat()
        identity.append([str(source.resolve()), stat.st_size, stat.st_mtime_ns])
    payload = json.dumps([_FORMAT_VERSION, dataset, identity]).encode()
    return hashlib.sha256(payload).hexdigest()[:24]


def load_cached(
    dataset: str,
    sources: Sequence[Path],
    names: Sequence[str],
    decode: Callable[[], dict[str, np.ndarray]],
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays ``names`` decoded from ``sources``: read-only, memory-mapped from the cache.

    On a miss ``decode()`` runs and its arrays are written to the cache. If the cache cannot be
    written the decoded arrays are returned in memory after a one-line warning: a read-only home
    directory must not stop an experiment.
    """
    entry = cache_root(cache_dir) / f"{dataset}-{cache_key(dataset, sources)}"
    cached = _read_entry(entry, names)
    if cached is not None:
        return cached
    arrays = decode()
    try:
        _write_entry(entry, arrays, names)
    except OSError as err:
        warnings.warn(
            f"dataset cache {entry.parent} is not writable ({err}); keeping {dataset} in memory",
            RuntimeWarning,
            stacklevel=2,
        )
        return _read_only(arrays, names)
    # Reopen what was written so the first load behaves (and shares memory) like every later one.
    reopened = _read_entry(entry, names)
    return reopened if reopened is not None else _read_only(arrays, names)


def _read_only(arrays: dict[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    # Cached arrays are read-only maps; in-memory ones must behave the same, so a caller that
    # writes into a dataset fails on the first run rather than only on a cache hit.
    for name in names:
        arrays[name].setflags(write=False)
    return {name: arrays[name] for name in names}


def _read_entry(entry: Path, names: Sequence[str]) -> dict[str, np.ndarray] | None:
    try:
        return {name: np.load(entry / f"{name}.npy", mmap_mode="r") for name in names}
    except (OSError, ValueError):
        # Absent, or unreadable for any reason: decoding again is always correct.
        return None


def _write_entry(entry: Path, arrays: dict[str, np.ndarray], names: Sequence[str]) -> None:
    entry.mkdir(parents=True, exist_ok=True)
    for name in names:
        _write_atomic(entry / f"{name}.npy", arrays[name])


def _write_atomic(path: Path, array: np.ndarray) -> None:
    # A temporary file in the same directory, renamed into place, means a killed process or a
    # concurrent writer never leaves a half-written file under the final name.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        # mkstemp creates owner-only files; a cache shared between users must stay readable.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
