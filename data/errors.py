"""Errors raised for bad input, so callers can tell a user mistake from a bug."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what is allowed."""


class DatasetNotFoundError(ConfigError, FileNotFoundError):
    """A dataset is missing; the message names every place looked and how to get it."""


class SceneError(ConfigError):
    """A scene file is corrupt or disagrees with the requested configuration."""
