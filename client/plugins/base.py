"""What a client plug-in is: a method's client-side work, named as the server names it.

The ClientApp dispatches a ``train`` message to the plug-in its ``TrainIns.plugin`` names (``""``:
plain local training, this base class) and registers every plug-in's queries as ``query.<action>``
handlers. A plug-in reads its own instruction from the message (``instruction``), shapes local
training through a ``task.hooks.TrainingHooks`` object, keeps what it needs as node state
(``client.state_store``) and may answer with a reply payload and arrays of its own (``Trained``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.update import local_update
from protocol.messages import SERVER, TrainIns, read_arrays, read_plugin_ins
from task.hooks import TrainingHooks
from task.local_training import TrainStats

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

QueryHandler = Callable[[LocalNode, Context, RecordDict], RecordDict]
"""(node, context, the query's content) -> the reply's content."""


@dataclass(frozen=True)
class Trained:
    """What a plug-in's training returns: the trained model, its stats, and its own reply payload and
    arrays (sent under the plug-in's name; None: nothing of its own)."""

    model: torch.nn.Module
    stats: TrainStats
    extra: object | None = None
    arrays: ArrayRecord | None = None


class ClientPlugin:
    """Plain local training: the sent arrays, the node's current (possibly corrected) labels, the
    instruction's learner and its schedule. A method's plug-in subclasses it, declares its ``name``
    and overrides ``train`` and ``queries``."""

    name: ClassVar[str] = ""

    def instruction(self, content: RecordDict, cls: type[T]) -> T:
        """The plug-in's own instruction in a message, as ``cls``."""
        return read_plugin_ins(content, self.name, cls)

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Train from the message's arrays with ``ins``'s settings (plain: no hooks of a method's own)."""
        state = read_arrays(content, SERVER).to_torch_state_dict()
        model, stats = local_update(node, state, TrainingHooks(ins.training, ins.schedule), ins.server_round,
                                    labels=current_labels(context, node))
        return Trained(model, stats)

    def queries(self) -> Mapping[str, QueryHandler]:
        """The plug-in's own query actions (``correct`` -> ``query.correct``) and their handlers."""
        return {}

