"""Device choice: ``auto`` picks CUDA when present; anything unavailable is a clear error."""

from __future__ import annotations

import torch

from common.errors import ConfigError


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
