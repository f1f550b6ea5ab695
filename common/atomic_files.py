"""Files that appear whole or not at all: JSON documents, and byte-reproducible ``.npz`` archives
that load without pickle.

Each is written to a temporary file in the target folder and renamed over the target, so a crash
leaves the previous file, never a half one. ``np.savez`` stamps each member with the current time,
so two saves of the same arrays differ; here every member carries a fixed timestamp and the members
are written in sorted order.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` so that the same arrays always give the same bytes.

    The file appears only when complete (temp file + rename), so a crash leaves no half file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as archive:
            for name in sorted(arrays):
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_TIME)
                info.external_attr = 0o644 << 16
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(arrays[name]), allow_pickle=False)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a scene is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array in ``path``; raises ``ValueError``/``OSError``/``zipfile.BadZipFile`` if unreadable."""
    if not zipfile.is_zipfile(path):  # np.load would also accept a bare .npy or a pickle
        raise ValueError(f"{path} is not an .npz (zip) file")
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` (never a half-written file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    """Write ``payload`` as JSON to ``path`` (never a half-written file; NaN is refused)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(payload, out, indent=1, allow_nan=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
