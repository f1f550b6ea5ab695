"""Errors raised for bad input, so callers can tell a user mistake from a bug."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what is allowed."""


class _Unset:
    """The value of a required setting the config does not give; shown as ``<unset>``."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET = _Unset()


class InvalidValue(ConfigError):
    """One value is invalid: ``<key>=<value> is invalid: <allowed>``.

    key: the value's dotted name; ``under(prefix)`` re-issues the error at the place the value
        came from (``lr`` checked by a settings class becomes ``strategy.train.lr``).
    value: the value as given (``UNSET`` for a required setting that is absent).
    allowed: what would be accepted.
    """

    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"{key}={value!r} is invalid: {allowed}")
        self.key = key
        self.value = value
        self.allowed = allowed

    def under(self, prefix: str) -> InvalidValue:
        """The same error with ``prefix.`` in front of its key (unchanged for an empty prefix)."""
        return InvalidValue(f"{prefix}.{self.key}" if prefix else self.key, self.value, self.allowed)


class UnknownKeys(ConfigError):
    """A config block has keys that are not options of it: ``<block> config has unknown keys [...]:
    allowed are [...]``; ``under(prefix)`` re-issues it at the place the block came from."""

    def __init__(self, block: str, unknown: list[str], allowed: list[str]) -> None:
        super().__init__(f"{block} config has unknown keys {unknown}: allowed are {allowed}")
        self.block = block
        self.unknown = unknown
        self.allowed = allowed

    def under(self, prefix: str) -> UnknownKeys:
        """The same error with ``prefix.`` in front of its block's name."""
        return UnknownKeys(f"{prefix}.{self.block}" if prefix else self.block, self.unknown, self.allowed)


class DatasetNotFoundError(ConfigError, FileNotFoundError):
    """A dataset is missing; the message names every place looked and how to get it."""


class SceneError(ConfigError):
    """A scene file is corrupt or disagrees with the requested configuration."""
