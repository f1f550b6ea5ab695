"""What leaves a client: every field of every reply, per message kind, declared once.

``REPLY_FIELDS`` lists each record key a client may send (``*``: every tensor of an arrays record),
its type and size, which strategies' clients send it and when, and whether it is a ground-truth
diagnostic: counts of the node's labels against their true labels, sent only when the run has
ground truth and the node allows it (``client.node.sends_ground_truth``: a simulated node, or a
deployed one whose node config sets ``ground-truth-diagnostics=true``). The keys come from the reply
payload classes themselves, so a new payload field cannot leave a client undeclared: the tests walk
every strategy's replies in process and compare them with this list, and check that
``docs/design.md`` carries ``markdown_table()`` (``python -m protocol.reply_fields`` prints it).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol.codec import keys_of, typed_keys
from protocol.fedcorr import CORRECT, CorrectRes, LidRes
from protocol.fedcorr import Diagnostics as CorrectDiagnostics
from protocol.feddiv import Diagnostics as FedDivDiagnostics
from protocol.feddiv import FedDivRes
from protocol.fednoro import CLASS_LOSS, ClassLossRes
from protocol.messages import (
    ARRAYS,
    EVALUATE,
    HELD,
    INFO,
    LOSS,
    METRICS,
    TRAIN,
    HeldState,
    NodeInfo,
    Scores,
    TrainStats,
)
from protocol.messages import plugin_arrays_key as plugin_arrays

EVERY = "*"
"""In ``ReplyField.senders``: the clients of every strategy."""
TENSORS = "*"
"""In ``ReplyField.key``: every tensor of an arrays record (named like the model's state dict)."""


@dataclass(frozen=True)
class ReplyField:
    """One field a client sends.

    message: the message type it answers; record: the record of the reply that holds it (``arrays``,
        ``metrics``, a plug-in's name, ``<plug-in>.arrays``); key: its record key (``TENSORS`` for the
        tensors of an arrays record); size: its type and size (M classes, P the model's state, P_w
        its trainable parameters); senders: the strategies whose clients send it (``EVERY``: all;
        empty: none asks); when: under which condition ("" always); ground_truth: a ground-truth
        diagnostic.
    """

    message: str
    record: str
    key: str
    size: str
    senders: tuple[str, ...]
    when: str = ""
    ground_truth: bool = False


_SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def _payload(message: str, record: str, cls: type, senders: tuple[str, ...], when: str = "", *,
             sizes: Mapping[str, str] | None = None, conditions: Mapping[str, str] | None = None,
             diagnostics: type | None = None) -> list[ReplyField]:
    """One field per record key of payload class ``cls``: a scalar's type from the class, a vector's
    size from ``sizes`` (required), a key's own condition from ``conditions`` (else ``when``); the
    keys of the nested ``diagnostics`` class are ground-truth diagnostics."""
    sizes, conditions = sizes or {}, conditions or {}
    truth = set(keys_of(diagnostics)) if diagnostics is not None else set()
    rows = []
    for key, kind in typed_keys(cls).items():
        if typing.get_origin(kind) is tuple:
            if key not in sizes:
                raise TypeError(f"{cls.__name__}'s vector {key!r} needs its size declared")
            size = sizes[key]
        else:
            size = sizes.get(key, _SCALARS[kind])
        rows.append(ReplyField(message, record, key, size, senders, conditions.get(key, when), key in truth))
    unused = sorted(set(sizes) - set(typed_keys(cls)))
    if unused:
        raise TypeError(f"sizes declared for keys {unused} that {cls.__name__} does not have")
    return rows


def _declared() -> tuple[ReplyField, ...]:
    split = {key: "stage 1" for key in ("mu-hat", "split-tp", "split-fp", "split-fn", "split-tn")}
    return (
        *_payload(INFO, METRICS, NodeInfo, (EVERY,), "once per run (discovery)",
                  sizes={"keeps-state": "int (0 or 1)",
                         "num-partitions": "int (a simulation's node count; 0 deployed)"}),
        *_payload(HELD, METRICS, HeldState, (EVERY,),
                  "once per attempt that continues a checkpoint (resume, extend_from, stages12_from)",
                  sizes={"answered": "int (a round number)"}),
        ReplyField(TRAIN, ARRAYS, TENSORS, "the trained model's state: P numbers (2P: Co-teaching's two networks)",
                   (EVERY,)),
        *_payload(TRAIN, METRICS, TrainStats, (EVERY,)),
        *_payload(TRAIN, "fedcorr", LidRes, ("fedcorr",), "stage 1",
                  conditions={"loss-share": "stage 1 with client_score=loss_share"}),
        *_payload(TRAIN, "feddiv", FedDivRes, ("feddiv",), "main phase", diagnostics=FedDivDiagnostics,
                  sizes={"class-known": "M ints", "class-trained": "M ints", "class-trained-wrong": "M ints"}),
        ReplyField(TRAIN, plugin_arrays("scaffold"), TENSORS,
                   "the control variate's change c_i+ - c_i: P_w numbers", ("scaffold",)),
        *_payload(EVALUATE, METRICS, Scores, (), "no strategy asks (the ClientApp answers it)"),
        *_payload(LOSS, METRICS, Scores, ("poc",), "each round, its candidates"),
        *_payload(LOSS, METRICS, Scores, ("fedcorr",), "each stage-1 iteration with client_score=disagreement"),
        *_payload(CORRECT, METRICS, CorrectRes, ("fedcorr",), "each correction", diagnostics=CorrectDiagnostics,
                  sizes={"confusion-before": "M x M ints", "confusion-after": "M x M ints"}, conditions=split),
        *_payload(CLASS_LOSS, METRICS, ClassLossRes, ("fednoro",), "each detection (once by default)",
                  sizes={"losses": "M floats", "present": "M ints (0 or 1)", "counts": "M ints"},
                  conditions={"present": "each detection, `detect_counts=false` (default)",
                              "counts": "each detection, `detect_counts=true`"}),
    )


REPLY_FIELDS: tuple[ReplyField, ...] = _declared()


def _senders(senders: tuple[str, ...]) -> str:
    if senders == (EVERY,):
        return "every strategy"
    return ", ".join(senders) if senders else "none"


def markdown_table(fields: tuple[ReplyField, ...] = REPLY_FIELDS) -> str:
    """The table of ``fields`` as ``docs/design.md`` shows it: one row per run of consecutive fields
    that agree on everything but their key."""
    def cells(row: ReplyField) -> tuple[Any, ...]:
        return (row.message, row.record, row.size, _senders(row.senders), row.when, row.ground_truth)

    groups: list[tuple[tuple[Any, ...], list[str]]] = []
    for row in fields:
        if groups and groups[-1][0] == cells(row):
            groups[-1][1].append(row.key)
        else:
            groups.append((cells(row), [row.key]))
    lines = ["| message | record | fields | type, size | sent by | when | ground truth only |",
             "|---|---|---|---|---|---|---|"]
    for (message, record, size, senders, when, truth), keys in groups:
        names = ", ".join(f"`{key}`" if key != TENSORS else "every tensor" for key in keys)
        lines.append(f"| `{message}` | `{record}` | {names} | {size} | {senders} | {when or 'always'} | "
                     f"{'yes' if truth else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
