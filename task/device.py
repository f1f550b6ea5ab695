"""Device choice: ``auto`` picks CUDA when present; anything unavailable is a clear error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from common.errors import ConfigError, InvalidValue


def resolve_device(name: str) -> torch.device:
    """The torch device for ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"device={name!r} is invalid: allowed are auto, cpu, cuda, cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available here; use device=auto or cpu")
    return device


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """The intra-op torch threads of this thread set to ``count`` inside the block and put back after it
    (None: left as they are)."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_device(key: str, name: object) -> None:
    """``name`` must be a device this machine has: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` with a
    CUDA device N here (checked before any work; a missing GPU would otherwise fail in every client)."""
    allowed = "auto, cpu, cuda, cuda:N"
    if not isinstance(name, str):
        raise InvalidValue(key, name, f"allowed are {allowed}")
    if name in ("auto", "cpu"):
        return
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InvalidValue(key, name, f"allowed are {allowed}") from None
    if device.type not in ("cpu", "cuda"):
        raise InvalidValue(key, name, f"allowed are {allowed}")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and count == 0:
        raise InvalidValue(key, name, "allowed are auto or cpu: this machine has no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise InvalidValue(key, name, f"no CUDA device {device.index}: this machine has {count} (cuda:0.."
                                      f"cuda:{count - 1})")
