"""A name registry for configurable components (partitioners, noise models)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.validation import Constraint


@dataclass(frozen=True)
class _Entry:
    func: Callable[..., Any]
    rules: Mapping[str, Constraint]
    check: Callable[[Mapping[str, Any]], None] | None


class Registry:
    """Maps a config name (``partition=iid``) to a function and the config keys it takes.

    kind: the config group, used in error messages (``partition``, ``noise``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, _Entry] = {}

    def add(self, name: str, func: Callable[..., Any], rules: Mapping[str, Constraint] | None = None,
            check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """Register ``func`` under ``name``; ``rules`` declares every parameter it takes and what is allowed;
        ``check`` (given the parameters once each passed its rule) refuses what involves several of them."""
        self._entries[name] = _Entry(func, dict(rules or {}), check)

    def rules(self, name: str) -> Mapping[str, Constraint]:
        """Every parameter ``name`` takes and its constraint."""
        return self._entries[name].rules

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def check(self, name: str, params: Mapping[str, Any]) -> None:
        """Raise ConfigError for an unknown name, a missing parameter or one its rule refuses. A
        parameter that may be null may also be absent (a scene file leaves nulls out)."""
        if name not in self._entries:
            raise ConfigError(
                f"{self.kind}={name!r} is invalid: allowed are {', '.join(self.names)}"
            )
        rules = self._entries[name].rules
        missing = [key for key, rule in rules.items() if key not in params and not rule.or_none]
        if missing:
            raise ConfigError(f"{self.kind}={name} needs {', '.join(f'{self.kind}.{k}' for k in missing)}")
        for key, constraint in rules.items():
            constraint.check(f"{self.kind}.{key}", params.get(key))
        together = self._entries[name].check
        if together is not None:
            together(params)

    def params(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters ``name`` takes, picked out of ``params`` (other keys are ignored; an absent
        nullable one is None)."""
        return {key: params.get(key) for key in self._entries[name].rules}

    def call(self, name: str, *args: Any, params: Mapping[str, Any]) -> Any:
        """Validate ``params`` and call the function registered as ``name``."""
        self.check(name, params)
        return self._entries[name].func(*args, **self.params(name, params))
