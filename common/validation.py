"""One vocabulary of constraints for configuration values and message fields, checked once.

A constraint checks one value under its key and says what it allows: ``Interval`` (a number between
bounds), ``Options`` (one of some names), ``Flag`` (true or false) and ``FolderPath``; each takes
``or_none=True`` to also admit None (the config's ``null``). A dataclass that subclasses ``Checked``
declares each field with ``option(constraint, meaning)`` and is checked once, on construction, in
the manner of scikit-learn's parameter constraints; ``Checked.check`` adds what involves several
fields. ``from_mapping`` builds such a class from a config block and names a bad value by its full
config key. Every refusal is one ``InvalidValue``, whose message ``<key>=<value> is invalid:
<allowed>`` is formatted in ``common.errors`` from the constraint's ``allowed()``; a constraint's
``invalid()`` gives, for tests, values it refuses. A constraint of its own subclasses ``Declared``.
"""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, Literal, Protocol, TypeVar

from common.errors import UNSET, InvalidValue, UnknownKeys

T = TypeVar("T")

CONSTRAINT = "constraint"
MEANING = "meaning"
FLAT = "flat"
"""Field metadata: a nested ``Checked`` field whose options sit in the same config block as its parent's."""
NAMESPACED = "namespaced"
"""Field metadata: a nested field whose keys travel in a message as ``<field>.<key>``."""


class Constraint(Protocol):
    """What a declared constraint does: check one value under its key, and say what it allows."""

    @property
    def or_none(self) -> bool:
        """Whether None (the config's ``null``) is allowed too."""

    def allowed(self) -> str:
        """What a refusal says is allowed: ``allowed is a number > 0``."""

    def check(self, key: str, value: Any) -> None:
        """Raise ``InvalidValue`` for ``key`` unless ``value`` is allowed."""

    def invalid(self) -> list[Any]:
        """Values the constraint refuses (bounds just missed, a wrong option, a wrong type)."""


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but True as a learning rate is always a mistake.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: int | float) -> bool:
    # An integer with hundreds of digits is no float: math.isfinite would raise OverflowError.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class Declared:
    """What the constraints share: None passes where ``or_none`` allows it, anything else must be
    admitted, and a refusal says what the constraint allows."""

    or_none: bool

    def allowed(self) -> str:
        """What a refusal says is allowed."""
        raise NotImplementedError

    def admits(self, value: Any) -> bool:
        """Whether ``value`` (not None) is allowed."""
        raise NotImplementedError

    def refused(self) -> list[Any]:
        """Values that are not None and not allowed."""
        raise NotImplementedError

    def check(self, key: str, value: Any) -> None:
        """Raise ``InvalidValue`` for ``key`` unless ``value`` is allowed (None: only with ``or_none``)."""
        if not (value is None and self.or_none) and not (value is not None and self.admits(value)):
            raise InvalidValue(key, value, self.allowed())

    def invalid(self) -> list[Any]:
        """The values ``refused`` lists, and None unless it is allowed."""
        return self.refused() if self.or_none else [*self.refused(), None]


Closed = Literal["both", "left", "right", "neither"]


@dataclass(frozen=True)
class Interval(Declared):
    """A number between ``low`` and ``high`` (None: unbounded above).

    kind: ``int`` (an integer; bools are not) or ``float`` (an int or a float).
    closed: which bounds belong to the interval: ``both``, ``left`` (low only), ``right`` (high
        only) or ``neither``.
    finite: floats must also be finite; otherwise an unbounded interval admits infinity.
    reason: why the bounds are what they are, added to a refusal.
    or_none: None is allowed too.
    """

    kind: type
    low: float
    high: float | None = None
    closed: Closed = "both"
    finite: bool = False
    reason: str = ""
    or_none: bool = False

    def _low_open(self) -> bool:
        return self.closed in ("right", "neither")

    def _high_open(self) -> bool:
        return self.closed in ("left", "neither")

    def allowed(self) -> str:
        """``allowed is a number > 0 and <= 1``."""
        noun = "an integer" if self.kind is int else "a finite number" if self.finite else "a number"
        text = f"allowed is {noun} {'>' if self._low_open() else '>='} {self.low}"
        if self.high is not None:
            text += f" and {'<' if self._high_open() else '<='} {self.high}"
        return f"{text} ({self.reason})" if self.reason else text

    def admits(self, value: Any) -> bool:
        """A number of the kind, finite if asked, within the bounds."""
        if self.kind is int:
            if not isinstance(value, int) or isinstance(value, bool):
                return False
        elif not _is_number(value) or (self.finite and not _finite(value)):
            return False
        above = value > self.low if self._low_open() else value >= self.low
        below = self.high is None or (value < self.high if self._high_open() else value <= self.high)
        return above and below

    def refused(self) -> list[Any]:
        """The values just outside each bound, a string and a bool, and for a finite or integer
        interval infinity (for an integer one also a fraction)."""
        step = 1 if self.kind is int else 0.5
        values: list[Any] = [self.low if self._low_open() else self.low - step, "x", True]
        if self.high is not None:
            values.append(self.high if self._high_open() else self.high + step)
        if self.kind is int:
            values.append(self.low + 0.5)
        if self.kind is int or self.finite:
            values.append(math.inf)
        return values


@dataclass(frozen=True)
class Options(Declared):
    """One of a fixed set of names."""

    values: tuple[str, ...]
    or_none: bool = False

    def allowed(self) -> str:
        """``allowed are a, b``."""
        return f"allowed are {', '.join(self.values)}"

    def admits(self, value: Any) -> bool:
        """One of ``values``."""
        return isinstance(value, str) and value in self.values

    def refused(self) -> list[Any]:
        """A name that is not an option, and a number."""
        return ["no_such_option", 1]


@dataclass(frozen=True)
class Flag(Declared):
    """true or false."""

    or_none: bool = False

    def allowed(self) -> str:
        """``allowed is true or false``."""
        return "allowed is true or false"

    def admits(self, value: Any) -> bool:
        """A bool."""
        return isinstance(value, bool)

    def refused(self) -> list[Any]:
        """A string and a number."""
        return ["yes", 1]


@dataclass(frozen=True)
class FolderPath(Declared):
    """A non-empty path string (``~`` is expanded where it is used)."""

    or_none: bool = False

    def allowed(self) -> str:
        """``allowed is a folder path or null``."""
        return "allowed is a folder path or null"

    def admits(self, value: Any) -> bool:
        """A string that is not blank."""
        return isinstance(value, str) and bool(value.strip())

    def refused(self) -> list[Any]:
        """A blank string and a number."""
        return [" ", 3]


@dataclass(frozen=True)
class Pattern(Declared):
    """A string that matches ``regex`` whole; ``allowed`` says what that is in words."""

    regex: str
    description: str
    or_none: bool = False

    def allowed(self) -> str:
        """``allowed is <description>``."""
        return f"allowed is {self.description}"

    def admits(self, value: Any) -> bool:
        """A string the pattern matches whole."""
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None

    def refused(self) -> list[Any]:
        """A blank string and a number."""
        return [" ", 3]


def option(constraint: Constraint | None = None, meaning: str = "", *, default: Any = MISSING,
           flat: bool = False, namespaced: bool = False) -> Any:
    """A dataclass field that declares its constraint and its one-line meaning:
    ``lr: float = option(Interval(float, 0, closed="neither", finite=True), "the learning rate")``.

    A field without a default takes its value from the config (``conf/`` holds the defaults).
    ``flat``: a nested ``Checked`` field whose options are keys of the parent's own block.
    ``namespaced``: a nested payload whose keys travel as ``<field>.<key>`` (``protocol.codec``).
    """
    metadata = {CONSTRAINT: constraint, MEANING: meaning, FLAT: flat, NAMESPACED: namespaced}
    return field(default=default, metadata=metadata)


class Checked:
    """Base of a dataclass whose fields declare constraints (``option``): each field is checked
    once, on construction, then ``check`` runs the checks that involve several fields."""

    def __post_init__(self) -> None:
        for spec in fields(self):  # type: ignore[arg-type]
            constraint = spec.metadata.get(CONSTRAINT)
            if constraint is not None:
                constraint.check(spec.name, getattr(self, spec.name))
        self.check()

    def check(self) -> None:
        """Checks across fields; raise ``InvalidValue`` naming the field (none by default)."""


def constraints(cls: type) -> dict[str, Constraint]:
    """The declared constraint of each field of dataclass ``cls`` that has one."""
    return {spec.name: spec.metadata[CONSTRAINT] for spec in fields(cls) if spec.metadata.get(CONSTRAINT)}


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, worked out once per class: with postponed annotations every call
    evaluates each annotation's text again, and settings are built from their classes thousands of
    times in a sweep or a test run. Callers must not modify the returned dict."""
    return typing.get_type_hints(cls)


def nested_type(cls: type, spec: Field[Any]) -> type | None:
    """The ``Checked`` dataclass a field of ``cls`` holds (``X`` or ``X | None``), or None."""
    hint = type_hints(cls)[spec.name]
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, Checked) and is_dataclass(candidate):
            return candidate
    return None


def keys_of(cls: type) -> list[str]:
    """The config keys of a settings block of ``cls``: its fields, with a flat nested field's keys
    in its place."""
    keys: list[str] = []
    for spec in fields(cls):
        inner = nested_type(cls, spec)
        keys += keys_of(inner) if spec.metadata.get(FLAT) and inner is not None else [spec.name]
    return keys


def _required(spec: Field[Any]) -> bool:
    return spec.init and spec.default is MISSING and spec.default_factory is MISSING


def _admits_none(cls: type, spec: Field[Any]) -> bool:
    return type(None) in typing.get_args(type_hints(cls)[spec.name])


def from_mapping(cls: type[T], cfg: Any, prefix: str, **given: Any) -> T:
    """An instance of settings dataclass ``cls`` from config block ``cfg`` found at ``prefix``.

    Keys that are not options of ``cls`` are refused; nested ``Checked`` fields are built from their
    own block (a flat one from this block's keys); ``given`` supplies fields built elsewhere. A
    missing key and every refused value are reported under their full key (``strategy.train.lr``).
    """
    allowed = [key for key in keys_of(cls) if key not in given]
    if not isinstance(cfg, Mapping):
        raise InvalidValue(prefix, cfg, f"allowed is a mapping with keys {allowed}")
    unknown = sorted(str(key) for key in cfg if key not in allowed)
    if unknown:
        raise UnknownKeys(prefix, unknown, allowed)
    kwargs = dict(given)
    for spec in fields(cls):  # type: ignore[arg-type]
        if spec.name in given or not spec.init:
            continue
        inner = nested_type(cls, spec)
        if inner is not None and spec.metadata.get(FLAT):
            kwargs[spec.name] = from_mapping(inner, {k: v for k, v in cfg.items() if k in keys_of(inner)}, prefix)
        elif spec.name not in cfg:
            if _required(spec):
                raise InvalidValue(f"{prefix}.{spec.name}", UNSET, "the config must set it")
        elif inner is not None and not (cfg[spec.name] is None and _admits_none(cls, spec)):
            kwargs[spec.name] = from_mapping(inner, cfg[spec.name], f"{prefix}.{spec.name}")
        else:
            kwargs[spec.name] = cfg[spec.name]
    try:
        return cls(**kwargs)
    except (InvalidValue, UnknownKeys) as err:
        raise err.under(prefix) from None
