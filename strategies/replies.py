"""Who a reply answers for, and the short reason of a client's failure."""

from __future__ import annotations

import re
from collections.abc import Iterable

from flwr.app import Message


def answering_node(reply: Message, sent: Iterable[Message]) -> int:
    """The node a reply answers for: the destination of the message it replies to. The SuperLink
    answers itself (src_node_id 1, "Node Unavailable") for a node that stopped sending heartbeats,
    so the sender is only the fallback. The grid stamps each message's id on it when it pushes it."""
    answered = reply.metadata.reply_to_message_id
    for message in sent:
        if answered and message.metadata.message_id == answered:
            return message.metadata.dst_node_id
    return reply.metadata.src_node_id


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def short_reason(reason: str | None) -> str:
    """The last line of a client error (its exception), without the Ray traceback and colour codes.
    Flower's ``Error.reason`` may be None; like an empty reason, that gives "(no reason given)"."""
    lines = [line.strip() for line in _ANSI.sub("", reason or "").splitlines() if line.strip()]
    return lines[-1] if lines else "(no reason given)"
