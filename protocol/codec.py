"""Typed payloads: frozen dataclasses to and from the flat records of a Flower message.

A payload's fields are ``int``, ``float``, ``bool`` or ``str`` (each optionally ``| None``), a
``tuple[int, ...]`` of counts or a ``tuple[float, ...]`` (a small per-class or per-component
vector, sent as a list; never per-sample values), or a nested payload dataclass
whose fields are flattened into the same record (optional nested payloads are all there or all
absent). A nested field declared ``option(..., namespaced=True)`` puts its
name before its keys (``lsr.gamma``), so two nested payloads may share field names. Field
``num_examples`` travels as key ``num-examples``: one naming style for every key, Flower's own.
``decode`` checks every key and type and names the sender and the key of the first problem; it never
lets a bare ``KeyError`` out.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import Field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from common.errors import ConfigError, InvalidValue
from common.validation import NAMESPACED, type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
Scalar = int | float | bool | str
Value = Scalar | list[int] | list[float]

_SCALARS = (int, float, bool, str)


class ProtocolError(ValueError):
    """A message is missing a key or carries a value of the wrong type.

    sender: who sent it (``client 3``, ``the server``); key: the offending key (None: the message
    as a whole); problem: what is wrong.
    """

    def __init__(self, sender: str, key: str | None, problem: str) -> None:
        where = "" if key is None else f" key {key!r}"
        super().__init__(f"{sender} sent a bad message:{where} {problem}")
        self.sender = sender
        self.key = key
        self.problem = problem


def record_key(name: str) -> str:
    """The record key of dataclass field ``name``: ``num_examples`` -> ``num-examples``."""
    return name.replace("_", "-")


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, True) or (hint, False)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _is_payload_class(hint: Any) -> TypeGuard[type[DataclassInstance]]:
    """Whether a field's type hint is a nested payload class (a dataclass; hints are never instances)."""
    return is_dataclass(hint)


def _nested_prefix(spec: Field[Any], prefix: str) -> str:
    """The key prefix of nested payload field ``spec`` under ``prefix``."""
    return f"{prefix}{record_key(spec.name)}." if spec.metadata.get(NAMESPACED) else prefix


def keys_of(cls: type, prefix: str = "") -> list[str]:
    """Every record key a payload class uses, nested payloads included."""
    keys: list[str] = []
    hints = type_hints(cls)
    for spec in fields(cls):
        inner, _ = _unwrap_optional(hints[spec.name])
        if _is_payload_class(inner):
            keys += keys_of(inner, _nested_prefix(spec, prefix))
        else:
            keys.append(prefix + record_key(spec.name))
    return keys


def typed_keys(cls: type, prefix: str = "") -> dict[str, Any]:
    """Every record key a payload class uses (as ``keys_of``), with its field's type (``X | None``
    unwrapped to ``X``)."""
    typed: dict[str, Any] = {}
    hints = type_hints(cls)
    for spec in fields(cls):
        inner, _ = _unwrap_optional(hints[spec.name])
        if _is_payload_class(inner):
            typed.update(typed_keys(inner, _nested_prefix(spec, prefix)))
        else:
            typed[prefix + record_key(spec.name)] = inner
    return typed


def encode(payload: Any, prefix: str = "") -> dict[str, Value]:
    """The flat record of a payload instance (fields that are None are left out)."""
    record: dict[str, Value] = {}
    for spec in fields(payload):
        value = getattr(payload, spec.name)
        if value is None:
            continue
        if is_dataclass(value):
            record.update(encode(value, _nested_prefix(spec, prefix)))
        elif isinstance(value, _SCALARS):
            record[prefix + record_key(spec.name)] = value
        elif isinstance(value, tuple) and all(type(item) is int for item in value):
            record[prefix + record_key(spec.name)] = list(value)
        elif isinstance(value, tuple) and all(type(item) is float for item in value):
            record[prefix + record_key(spec.name)] = list(value)
        else:
            raise TypeError(f"field {spec.name} of {type(payload).__name__} holds {value!r}: not a scalar")
    return record


def _vector(value: Any, hint: Any, sender: str, key: str) -> tuple[int, ...] | tuple[float, ...]:
    if typing.get_args(hint)[0] is float:
        # A list of ints is a valid float vector (a MetricRecord may hold whole numbers as ints).
        if isinstance(value, list) and all(isinstance(item, (int, float)) and not isinstance(item, bool)
                                           for item in value):
            return tuple(float(item) for item in value)
        raise ProtocolError(sender, key, f"holds {value!r}: expected a list of numbers")
    if isinstance(value, list) and all(type(item) is int for item in value):
        return tuple(value)
    raise ProtocolError(sender, key, f"holds {value!r}: expected a list of integer counts")


def _scalar(value: Any, hint: Any, sender: str, key: str) -> Scalar:
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (bool, str) and type(value) is hint:
        return value
    name = getattr(hint, "__name__", str(hint))
    raise ProtocolError(sender, key, f"holds {value!r} of type {type(value).__name__}: expected {name}")


def _decode(cls: type[T], record: Mapping[str, Any], sender: str, prefix: str = "") -> T:
    hints = type_hints(cls)
    kwargs: dict[str, Any] = {}
    for spec in fields(cls):
        hint, optional = _unwrap_optional(hints[spec.name])
        if _is_payload_class(hint):
            inner_prefix = _nested_prefix(spec, prefix)
            present = [key for key in keys_of(hint, inner_prefix) if key in record]
            if optional and not present:
                kwargs[spec.name] = None
            else:
                kwargs[spec.name] = _decode(hint, record, sender, inner_prefix)
            continue
        key = prefix + record_key(spec.name)
        if key in record:
            value = record[key]
            kwargs[spec.name] = (_vector(value, hint, sender, key) if typing.get_origin(hint) is tuple
                                 else _scalar(value, hint, sender, key))
        elif optional:
            kwargs[spec.name] = None
        else:
            raise ProtocolError(sender, key, "is missing")
    try:
        return cls(**kwargs)
    except InvalidValue as err:
        raise ProtocolError(sender, prefix + record_key(err.key.rsplit(".", 1)[-1]),
                            f"is invalid: {err.allowed}") from None
    except ConfigError as err:
        raise ProtocolError(sender, None, str(err)) from None


def decode(cls: type[T], record: Mapping[str, Any], sender: str) -> T:
    """An instance of payload class ``cls`` from a flat ``record`` that ``sender`` sent.

    Raises ProtocolError for a missing key, an unknown key, a value of the wrong type or a value
    the class refuses.
    """
    unknown = sorted(set(record) - set(keys_of(cls)))
    if unknown:
        raise ProtocolError(sender, unknown[0], f"is not part of a {cls.__name__}")
    return _decode(cls, record, sender)
