"""Reader for the IDX format of (Fashion-)MNIST, gzip-compressed or not."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import ConfigError

# Type byte of the magic number -> big-endian element type (http://yann.lecun.com/exdb/mnist/).
_IDX_TYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: Path) -> np.ndarray:
    """The array stored in the IDX file ``path`` (``.gz`` is decompressed), in native byte order.

    Raises ConfigError naming the file if it is not IDX, is truncated, or has trailing bytes.
    """
    raw = _read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ConfigError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    dtype, ndim = _IDX_TYPES[raw[2]], raw[3]
    header_size = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header_size:
        raise ConfigError(f"{path}: corrupt IDX header ({ndim} dimensions, {len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header_size + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise ConfigError(
            f"{path}: IDX file has {len(raw)} bytes but its header (shape {shape}) needs"
            f" {expected}; the file is truncated or corrupt"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_size).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _read_bytes(path: Path) -> bytes:
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ConfigError(f"{path}: corrupt or truncated gzip file ({err})") from err
