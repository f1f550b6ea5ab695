"""The client-side plug-in point: each method's client work, found by name.

A module in ``client/methods/`` that defines ``METHOD = ClientMethod(...)`` registers it; the
ClientApp dispatches a ``train`` message to the method its ``TrainIns.method`` names (``""``: plain
local SGD) and registers every method's queries as ``query.<action>`` handlers. A new method adds
its module there and edits nothing else.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.update import local_update
from protocol.messages import TrainIns
from task.local_training import TrainStats


@dataclass(frozen=True)
class Trained:
    """What a method's training returns: the trained model, its stats, and the method's extra reply
    payload (sent under the method's name; None: nothing extra)."""

    model: torch.nn.Module
    stats: TrainStats
    extra: Any = None


TrainFn = Callable[[LocalNode, Context, ArrayRecord, TrainIns, Any], Trained]
"""(node, context, global arrays, instruction, the method's options or None) -> Trained."""

QueryFn = Callable[[LocalNode, Context, RecordDict], RecordDict]
"""(node, context, the query's content) -> the reply's content."""


def plain_train(node: LocalNode, context: Context, arrays: ArrayRecord, ins: TrainIns, options: Any) -> Trained:
    """Local SGD from the global arrays on the node's current (possibly corrected) labels, with the
    instruction's learner and its schedule."""
    model, stats = local_update(node, arrays.to_torch_state_dict(), ins.training, ins.server_round,
                                labels=current_labels(context, node), schedule=ins.schedule)
    return Trained(model, stats)


@dataclass(frozen=True)
class ClientMethod:
    """A method's client-side work.

    name: the method name in ``TrainIns.method`` (and the record key of its options and extras).
    options: the dataclass of its train options (``protocol.<method>``); None: it takes none.
    train: its local training (default ``plain_train``: local SGD, for a method with only queries).
    queries: its own query actions (``correct`` -> ``query.correct``) and their handlers.
    """

    name: str
    options: type | None = None
    train: TrainFn = plain_train
    queries: Mapping[str, QueryFn] = field(default_factory=dict)


PLAIN = ClientMethod("")


@functools.cache
def client_methods() -> dict[str, ClientMethod]:
    """Every registered method by name (the modules of ``client/methods/`` that define ``METHOD``)."""
    found = {PLAIN.name: PLAIN}
    folder = Path(__file__).parent / "methods"
    for module in sorted(info.name for info in pkgutil.iter_modules([str(folder)])):
        method = getattr(importlib.import_module(f"client.methods.{module}"), "METHOD", None)
        if isinstance(method, ClientMethod):
            found[method.name] = method
    return found


def client_method(name: str) -> ClientMethod:
    """The method ``name``; an unknown one is an error naming the known ones."""
    methods = client_methods()
    if name not in methods:
        known = ", ".join(repr(known) for known in methods)
        raise ValueError(f"the server asked for client method {name!r}; this node knows {known}")
    return methods[name]
