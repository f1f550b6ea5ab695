"""A name registry for configurable components (partitioners, noise models)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError


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
        """The registered names, in registration order."""
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
