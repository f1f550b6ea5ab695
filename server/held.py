"""Before a run continues from a checkpoint (a resume, ``extend_from``, ``strategy.stages12_from``):
every node must still hold the state it had there.

A node records each round it handles an instruction in as part of its state, with the version each
other record of its state had then (``client.state_store``), and the server's run log records each
partition's last good reply (``RunLog.answered``), which the checkpoint keeps. A ``query.held`` under
the continuing run's scope asks every node for the last such round its state admits whole. A node
that answers an earlier round than the checkpoint records has lost state it had: its state folder
was emptied, moved or partly deleted, or it was started with another one. It would
start over from its own labels and the run would go on silently on the wrong state, so the run is
refused before any work.
"""

from __future__ import annotations

from flwr.serverapp import Grid

from common.errors import InvalidValue
from protocol.messages import HELD, HeldState, StateScope, instruction, with_scope
from server.discovery import ask_every_node
from strategies.federation import Federation


def held_rounds(grid: Grid, federation: Federation, scope: StateScope,
                timeout: float) -> tuple[dict[int, int], list[str]]:
    """Each partition's answer to a ``query.held`` under ``scope``, and one problem per node that failed
    (not through a strategy: these answers are not rounds of the run)."""
    answers, problems = ask_every_node(grid, list(federation.node_of.values()), HELD,
                                       lambda: with_scope(instruction(), scope), HeldState, timeout)
    return {federation.partition_of(node): held.answered for node, held in answers.items()}, problems


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
