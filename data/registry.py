"""A name registry for configurable components (partitioners, noise models)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from data.errors import ConfigError


@dataclass(frozen=True)
class _Entry:
    func: Callable[..., Any]
    keys: tuple[str, ...]
    check: Callable[[Mapping[str, Any]], None] | None


class Registry:
    """Maps a config name (``partition=iid``) to a function and the config keys it takes.

    kind: the config group, used in error messages (``partition``, ``noise``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, _Entry] = {}

    def add(
        self,
        name: str,
        func: Callable[..., Any],
        keys: tuple[str, ...] = (),
        check: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        """Register ``func`` under ``name``; ``check`` validates its parameters before any work."""
        self._entries[name] = _Entry(func, keys, check)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def check(self, name: str, params: Mapping[str, Any]) -> None:
        """Raise ConfigError for an unknown name or a parameter outside its allowed range."""
        if name not in self._entries:
            raise ConfigError(
                f"{self.kind}={name!r} is unknown: allowed are {', '.join(self.names)}"
            )
        entry = self._entries[name]
        missing = [key for key in entry.keys if key not in params]
        if missing:
            raise ConfigError(f"{self.kind}={name} needs {', '.join(f'{self.kind}.{k}' for k in missing)}")
        if entry.check is not None:
            entry.check(params)

    def params(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters ``name`` takes, picked out of ``params`` (other keys are ignored)."""
        return {key: params[key] for key in self._entries[name].keys}

    def call(self, name: str, *args: Any, params: Mapping[str, Any]) -> Any:
        """Validate ``params`` and call the function registered as ``name``."""
        self.check(name, params)
        return self._entries[name].func(*args, **self.params(name, params))


def check_number(
    key: str, value: Any, *, low: float, high: float | None = None, low_open: bool = False
) -> None:
    """Raise ConfigError unless config ``key`` is a number >= low (> low if low_open) and <= high."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and (value > low if low_open else value >= low) and (high is None or value <= high):
        return
    bound = f"{'>' if low_open else '>='} {low}" + ("" if high is None else f" and <= {high}")
    raise ConfigError(f"{key}={value!r} is invalid: allowed is a number {bound}")


def check_int(key: str, value: Any, *, low: int) -> None:
    """Raise ConfigError unless config ``key`` is an integer >= low."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{key}={value!r} is invalid: allowed is an integer >= {low}")


def dataclass_kwargs(kind: str, cfg: Any, cls: type) -> dict[str, Any]:
    """``cfg`` as keyword arguments for dataclass ``cls``: a mapping whose keys are all fields of it."""
    allowed = [f.name for f in fields(cls)]
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{kind} config {cfg!r} is invalid: allowed is a mapping with keys {allowed}")
    unknown = sorted(str(key) for key in cfg if key not in allowed)
    if unknown:
        raise ConfigError(f"{kind} config has unknown keys {unknown}: allowed are {allowed}")
    return {key: cfg[key] for key in cfg}
