"""Checks of configuration values, plain and declarative.

Every check raises one ``InvalidValue`` naming the key, the value and what is allowed. Settings
dataclasses declare their constraints on the fields (``field(metadata=rule(...))``) and
run them once in ``__post_init__`` with ``check_fields``, in the manner of scikit-learn's
parameter constraints; ``settings_from_mapping`` builds such a class from a config mapping and
names a bad value by its full config key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any, Protocol, TypeVar

from common.errors import UNSET, ConfigError, InvalidValue

T = TypeVar("T")


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but True as a learning rate is always a mistake.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(key: str, value: Any, *, low: float, high: float | None = None, low_open: bool = False) -> None:
    """``key`` must be a number >= low (> low if low_open) and <= high."""
    if _is_number(value) and (value > low if low_open else value >= low) and (high is None or value <= high):
        return
    bound = f"{'>' if low_open else '>='} {low}" + ("" if high is None else f" and <= {high}")
    raise InvalidValue(key, value, f"allowed is a number {bound}")


def _finite(value: int | float) -> bool:
    # An integer with hundreds of digits is no float: math.isfinite would raise OverflowError.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_real(key: str, value: Any, *, low: float, low_open: bool = False, below: float | None = None) -> None:
    """``key`` must be a finite number >= low (> low if low_open) and < below (a finite float)."""
    if _is_number(value) and _finite(value):
        if (value > low if low_open else value >= low) and (below is None or value < below):
            return
    bound = f"{'>' if low_open else '>='} {low}" + ("" if below is None else f" and < {below}")
    raise InvalidValue(key, value, f"allowed is a finite number {bound}")


def check_int(key: str, value: Any, *, low: int, high: int | None = None) -> None:
    """``key`` must be an integer >= low (and <= high)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high):
        return
    raise InvalidValue(key, value, f"allowed is an integer >= {low}" + ("" if high is None else f" and <= {high}"))


def check_bool(key: str, value: Any) -> None:
    """``key`` must be true or false."""
    if not isinstance(value, bool):
        raise InvalidValue(key, value, "allowed is true or false")


def check_choice(key: str, value: Any, options: Sequence[str]) -> None:
    """``key`` must be one of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise InvalidValue(key, value, f"allowed are {', '.join(options)}")


class Constraint(Protocol):
    """What a declared field constraint does: check one value under its key."""

    def check(self, key: str, value: Any) -> None:
        """Raise ``InvalidValue`` for ``key`` unless ``value`` satisfies the constraint."""


@dataclass(frozen=True)
class Number:
    """A number >= low (> low if low_open), <= high; infinities pass unless ``high`` excludes them."""

    low: float
    high: float | None = None
    low_open: bool = False

    def check(self, key: str, value: Any) -> None:
        """``value`` must be such a number (see ``check_number``)."""
        check_number(key, value, low=self.low, high=self.high, low_open=self.low_open)


@dataclass(frozen=True)
class Real:
    """A finite number >= low (> low if low_open) and < below."""

    low: float
    low_open: bool = False
    below: float | None = None

    def check(self, key: str, value: Any) -> None:
        """``value`` must be such a finite number (see ``check_real``)."""
        check_real(key, value, low=self.low, low_open=self.low_open, below=self.below)


@dataclass(frozen=True)
class Integer:
    """An integer >= low (and <= high)."""

    low: int
    high: int | None = None

    def check(self, key: str, value: Any) -> None:
        """``value`` must be such an integer (see ``check_int``)."""
        check_int(key, value, low=self.low, high=self.high)


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of names."""

    options: tuple[str, ...]

    def check(self, key: str, value: Any) -> None:
        """``value`` must be one of ``options``."""
        check_choice(key, value, self.options)


@dataclass(frozen=True)
class Flag:
    """true or false."""

    def check(self, key: str, value: Any) -> None:
        """``value`` must be true or false."""
        check_bool(key, value)


@dataclass(frozen=True)
class Nullable:
    """None (the config's ``null``), or a value that passes ``inner``."""

    inner: Constraint

    def check(self, key: str, value: Any) -> None:
        """``value`` must be None or pass ``inner``."""
        if value is not None:
            self.inner.check(key, value)


@dataclass(frozen=True)
class PathText:
    """A non-empty path string (``~`` is expanded where it is used)."""

    def check(self, key: str, value: Any) -> None:
        """``value`` must be such a string."""
        if not isinstance(value, str) or not value.strip():
            raise InvalidValue(key, value, "allowed is a folder path or null")


@dataclass(frozen=True)
class Explained:
    """``inner``, with the reason for its bounds added to the message."""

    inner: Constraint
    reason: str

    def check(self, key: str, value: Any) -> None:
        """``value`` must pass ``inner``; a refusal says why the bound exists."""
        try:
            self.inner.check(key, value)
        except InvalidValue as err:
            raise InvalidValue(err.key, err.value, f"{err.allowed} ({self.reason})") from None


def rule(constraint: Constraint) -> dict[str, Constraint]:
    """Field metadata declaring ``constraint``: ``lr: float = field(metadata=rule(Real(low=0, low_open=True)))``."""
    return {"check": constraint}


def check_fields(obj: Any, prefix: str = "") -> None:
    """Run every declared constraint of dataclass instance ``obj`` (keys ``prefix.field``)."""
    for spec in fields(obj):
        constraint = spec.metadata.get("check")
        if constraint is not None:
            constraint.check(f"{prefix}.{spec.name}" if prefix else spec.name, getattr(obj, spec.name))


def dataclass_kwargs(kind: str, cfg: Any, cls: type) -> dict[str, Any]:
    """``cfg`` as keyword arguments for dataclass ``cls``: a mapping whose keys are all fields of it."""
    allowed = [f.name for f in fields(cls) if f.init]
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{kind} config {cfg!r} is invalid: allowed is a mapping with keys {allowed}")
    unknown = sorted(str(key) for key in cfg if key not in allowed)
    if unknown:
        raise ConfigError(f"{kind} config has unknown keys {unknown}: allowed are {allowed}")
    return {key: cfg[key] for key in cfg}


def _required(spec: Field) -> bool:
    return spec.init and spec.default is MISSING and spec.default_factory is MISSING


def settings_from_mapping(cls: type[T], cfg: Any, prefix: str, **given: Any) -> T:
    """An instance of settings dataclass ``cls`` from config mapping ``cfg`` found at ``prefix``.

    Keys of ``cfg`` that are not fields of ``cls`` are refused; ``given`` supplies fields built
    elsewhere (nested settings). A missing required key and every value the class checks are
    reported under their full key (``strategy.train.lr``).
    """
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(cfg, Mapping):
        raise InvalidValue(prefix, cfg, f"allowed is a mapping with keys {[f.name for f in fields(cls) if f.init]}")
    kwargs = {**dataclass_kwargs(prefix, {k: v for k, v in cfg.items() if k not in given}, cls), **given}
    missing = [spec.name for spec in fields(cls) if _required(spec) and spec.name not in kwargs]
    if missing:
        raise InvalidValue(f"{prefix}.{missing[0]}", UNSET, "the config must set it")
    try:
        return cls(**kwargs)
    except InvalidValue as err:
        raise err.under(prefix) from None
