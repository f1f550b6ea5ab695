"""Before a run continues from a checkpoint (a resume, ``extend_from``, ``strategy.stages12_from``):
every node must still hold the state it had there.

A node records each round it handles an instruction in as part of its state (``client.state_store``),
and the server's run log records each partition's last good reply (``RunLog.answered``), which the
checkpoint keeps. A ``query.held`` under the continuing run's scope asks every node for the last such
round its state admits. A node that answers an earlier round than the checkpoint records has lost
state it had: its state folder was emptied or moved, or it was started with another one. It would
start over from its own labels and the run would go on silently on the wrong state, so the run is
refused before any work.
"""

from __future__ import annotations

import logging

from flwr.app import Message
from flwr.serverapp import Grid

from common.errors import InvalidValue
from protocol.codec import ProtocolError
from protocol.messages import HELD, HeldState, StateScope, instruction, read_reply, with_scope
from strategies.federation import Federation
from strategies.replies import answering_node, short_reason

log = logging.getLogger(__name__)


def held_rounds(grid: Grid, federation: Federation, scope: StateScope,
                timeout: float) -> tuple[dict[int, int], list[str]]:
    """Each partition's answer to a ``query.held`` under ``scope``, and one problem per node that failed.

    Sent by the grid directly, not through a strategy: these answers are not rounds of the run."""
    queries = [Message(content=with_scope(instruction(), scope), message_type=HELD, dst_node_id=node)
               for node in federation.node_of.values()]
    replies = list(grid.send_and_receive(queries, timeout=timeout))
    answered: dict[int, int] = {}
    problems = []
    replied = set()
    for reply in replies:
        pid = federation.partition_of(answering_node(reply, queries))
        replied.add(pid)
        if reply.has_error():
            log.debug("client %d failed the held query with:\n%s", pid, reply.error.reason)
            problems.append(f"client {pid} failed the held query: {short_reason(reply.error.reason)}")
            continue
        try:
            answered[pid] = read_reply(reply.content, HeldState, f"client {pid}").answered
        except ProtocolError as err:
            problems.append(str(err))
    problems.extend(f"client {pid} did not answer the held query in time"
                    for pid in sorted(set(federation.node_of) - replied))
    return answered, problems


def check_nodes_hold_state(grid: Grid, federation: Federation, scope: StateScope, expected: dict[int, int],
                           key: str, value: bool | str, timeout: float) -> None:
    """Refuse to continue (``InvalidValue`` on ``key``) unless every partition answers at least the round
    ``expected`` records for it (the run log's ``answered`` at the checkpoint). Nothing is asked when
    the checkpoint records no round (one written before nodes recorded theirs)."""
    if not any(expected.values()):
        return
    held, problems = held_rounds(grid, federation, scope, timeout)
    if problems:
        raise RuntimeError("; ".join(problems))
    lost = sorted(pid for pid, last in expected.items() if last > 0 and held[pid] < last)
    if not lost:
        return
    shown = ", ".join(f"{pid} (answered in round {expected[pid]}, keeps state up to round {held[pid]})"
                      for pid in lost[:5])
    raise InvalidValue(key, value, f"nodes that hold their state as it was at the checkpoint; the nodes of partitions "
                                   f"{shown}{' ...' if len(lost) > 5 else ''} do not, so they would start over "
                                   "from their own labels (start each with the state-dir it ran with, or start "
                                   "the run over)")
