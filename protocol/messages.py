"""The messages every strategy and plug-in uses: their types, typed instructions and replies, and the record layout.

A message's content is a ``RecordDict``:

- ``arrays``: an ``ArrayRecord`` (model weights), when the message carries any;
- ``config`` (an instruction) or ``metrics`` (a reply): the payload dataclass as one flat record;
- ``<plugin>``: a client plug-in's own instruction (with a train instruction) or reply payload (its
  extra, with a train reply), as its own record named after the plug-in (``fedcorr``, ``feddyn``);
- ``<plugin>.arrays``: a plug-in's own arrays, each way (weight-shaped state such as control variates);
- ``scope``: on every instruction of a run's rounds, the ``StateScope`` that says which versions of
  the node's persistent state the message may read and which one it writes.

Kinds (``docs/design.md`` has the table):

==================  ====================================  ==========================================
message type        instruction                           reply
==================  ====================================  ==========================================
``query.info``      (empty)                               ``NodeInfo``
``train``           arrays + ``TrainIns`` [+ plug-in's]   arrays + ``TrainStats`` [+ plug-in's extra]
``evaluate``        arrays                                ``Scores`` (on the node's current labels)
``query.loss``      arrays                                ``Scores`` (PoC's candidates; FedCorr's disagreement)
``query.held``      (scope only)                          ``HeldState`` (a run that continues a checkpoint)
==================  ====================================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, MetricRecordValues, RecordDict

from common.validation import option
from protocol.codec import ProtocolError, decode, encode
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining, TrainStats
from task.scores import Scores

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

__all__ = [
    "ARRAYS", "CONFIG", "EVALUATE", "HELD", "INFO", "LOSS", "METRICS", "SCOPE", "SERVER", "TRAIN",
    "HeldState", "NodeInfo", "Scores", "StateScope", "TrainIns", "TrainStats",
    "instruction", "read_arrays", "read_extra", "read_instruction", "read_plugin_ins", "read_plugin_arrays",
    "read_reply", "read_scope", "reply", "with_scope",
]

INFO = f"{MessageType.QUERY}.info"
TRAIN = MessageType.TRAIN
EVALUATE = MessageType.EVALUATE
LOSS = f"{MessageType.QUERY}.loss"
HELD = f"{MessageType.QUERY}.held"

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
SCOPE = "scope"

SERVER = "the server"


@dataclass(frozen=True)
class NodeInfo:
    """Reply to ``query.info``: which partition a node holds, how many training samples it has,
    whether it keeps its state on disk (1: a state folder, so a resumed run finds it; 0: in memory),
    and for a virtual node of Flower's simulation runtime how many nodes the federation was given
    (its ``num-partitions``; 0 for a deployed node), so a size that differs from ``num_clients`` is
    refused at once instead of waiting for nodes that never come."""

    partition_id: int
    num_examples: int
    keeps_state: int
    num_partitions: int = 0


@dataclass(frozen=True)
class HeldState:
    """Reply to ``query.held``, asked of every node before a run continues from a checkpoint: the
    last round the node answered an instruction of that run (or of the run it continues) in, as far
    as the state it keeps for the instruction's scope says; earlier when a record it held then has
    lost that version since (the round of the version left, 0 for none); 0 when it keeps none (a
    state folder emptied, moved, or another than the one it ran with)."""

    answered: int


@dataclass(frozen=True)
class TrainIns:
    """A ``train`` instruction: train from the sent arrays for ``server_round``.

    training: the local training settings (with the learner and its settings).
    plugin: the client plug-in that trains (``""``: plain local training); its own instruction, if
        any, travels in a record of that name.
    schedule: the learner's values for this round (LSR's gamma_t, Co-teaching's forget rate).
    """

    server_round: int
    training: LocalTraining
    plugin: str = ""
    schedule: LearnerSchedule = option(default=LearnerSchedule(), namespaced=True)


@dataclass(frozen=True)
class StateScope:
    """Which versions of a node's persistent state an instruction may read, and which it writes.

    A node keeps each piece of state (corrected labels, a control variate) as versions named by the
    round that wrote them and the attempt of the run (1, then one more per resume), so that a run
    resumed from its checkpoint of round C ignores what the killed attempt wrote after C.

    run: the run's key: the same across the resumes of one run, a new one for every fresh run.
    round: the round the instruction belongs to: the version any state it changes is written as.
    resumed_at: the checkpoint round each resume continued from, in order (empty before the first).
    keep: the rounds of the checkpoints the server keeps: for each, the node keeps its newest
        version at or before it, and every version after the newest of them.
    parent: the run whose state this run starts from, read where this run has written none
        (``strategy.stages12_from``; "" for none); parent_round: the parent's checkpoint round;
        parent_resumed_at: the parent's resumes.
    """

    run: str
    round: int
    resumed_at: tuple[int, ...] = ()
    keep: tuple[int, ...] = ()
    parent: str = ""
    parent_round: int = 0
    parent_resumed_at: tuple[int, ...] = ()


def with_scope(content: RecordDict, scope: StateScope) -> RecordDict:
    """``content`` with ``scope`` as its ``scope`` record (replacing any)."""
    content[SCOPE] = ConfigRecord(dict(encode(scope)))
    return content


def read_scope(content: RecordDict, sender: str = SERVER) -> StateScope | None:
    """The instruction's ``StateScope``; None when it carries none (an instruction outside a run's
    rounds, or from a test)."""
    if SCOPE not in content:
        return None
    return decode(StateScope, _record(content, SCOPE, ConfigRecord, sender), sender)


def plugin_arrays_key(plugin: str) -> str:
    """The record key of a plug-in's own arrays."""
    return f"{plugin}.{ARRAYS}"


def instruction(payload: Any = None, *, arrays: ArrayRecord | None = None, plugin_ins: Any = None,
                plugin_arrays: ArrayRecord | None = None, plugin: str = "") -> RecordDict:
    """The content of an instruction: ``arrays``, ``payload`` as ``config``, the plug-in's own
    instruction ``plugin_ins`` under ``plugin`` and its ``plugin_arrays`` under ``<plugin>.arrays``."""
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS] = arrays
    if payload is not None:
        # dict(): the same items, typed with ConfigRecord's value types (dict is invariant)
        content[CONFIG] = ConfigRecord(dict(encode(payload)))
    if plugin_ins is not None:
        content[plugin] = ConfigRecord(dict(encode(plugin_ins)))
    if plugin_arrays is not None:
        content[plugin_arrays_key(plugin)] = plugin_arrays
    return content


def reply(payload: Any, *, arrays: ArrayRecord | None = None, extra: Any = None,
          plugin_arrays: ArrayRecord | None = None, plugin: str = "") -> RecordDict:
    """The content of a reply: ``arrays``, ``payload`` as ``metrics``, the plug-in's reply payload
    ``extra`` under ``plugin`` and its ``plugin_arrays`` under ``<plugin>.arrays``."""
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS] = arrays
    # Reply payloads hold numbers only (a str would not fit a MetricRecord, which checks every value).
    content[METRICS] = MetricRecord(cast(dict[str, MetricRecordValues], encode(payload)))
    if extra is not None:
        content[plugin] = MetricRecord(cast(dict[str, MetricRecordValues], encode(extra)))
    if plugin_arrays is not None:
        content[plugin_arrays_key(plugin)] = plugin_arrays
    return content


def _record(content: RecordDict, key: str, kind: type, sender: str) -> Any:
    if key not in content:
        raise ProtocolError(sender, key, "is missing")
    record = content[key]
    if not isinstance(record, kind):
        raise ProtocolError(sender, key, f"holds a {type(record).__name__}: expected a {kind.__name__}")
    return record


def read_instruction(content: RecordDict, cls: type[T], sender: str = SERVER) -> T:
    """The ``config`` record of an instruction as ``cls``."""
    return decode(cls, _record(content, CONFIG, ConfigRecord, sender), sender)


def read_plugin_ins(content: RecordDict, plugin: str, cls: type[T], sender: str = SERVER) -> T:
    """A plug-in's own instruction record as ``cls``."""
    return decode(cls, _record(content, plugin, ConfigRecord, sender), sender)


def read_reply(content: RecordDict, cls: type[T], sender: str) -> T:
    """The ``metrics`` record of a reply as ``cls``."""
    return decode(cls, _record(content, METRICS, MetricRecord, sender), sender)


def read_extra(content: RecordDict, plugin: str, cls: type[T], sender: str) -> T:
    """A plug-in's reply payload (the reply's extra) as ``cls``."""
    return decode(cls, _record(content, plugin, MetricRecord, sender), sender)


def read_plugin_arrays(content: RecordDict, plugin: str, sender: str, like: ArrayRecord | None = None) -> ArrayRecord:
    """A plug-in's own arrays (``<plugin>.arrays``); with ``like``, checked as ``read_arrays`` does."""
    return read_arrays(content, sender, like, key=plugin_arrays_key(plugin))


def read_arrays(content: RecordDict, sender: str, like: ArrayRecord | None = None, key: str = ARRAYS) -> ArrayRecord:
    """The ``arrays`` record (or the one at ``key``); with ``like``, checked to hold the same keys with
    the same shapes."""
    arrays = _record(content, key, ArrayRecord, sender)
    if like is not None:
        missing = sorted(set(like) - set(arrays))
        extra = sorted(set(arrays) - set(like))
        if missing or extra:
            raise ProtocolError(sender, key,
                                f"do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
        for name, array in like.items():
            if tuple(arrays[name].shape) != tuple(array.shape):
                raise ProtocolError(sender, key, f"array {name!r} has shape {tuple(arrays[name].shape)}: "
                                                    f"expected {tuple(array.shape)}")
    return arrays

