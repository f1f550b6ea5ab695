"""Node discovery: wait for the expected Flower nodes, then learn which partition each one holds.

Flower gives nodes random ids; our clients are partitions 0..N-1. A ``query.info`` round asks every
node for its partition id and local set size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from protocol.codec import ProtocolError
from protocol.messages import INFO, NodeInfo, instruction, read_reply
from strategies.federation import Federation
from strategies.replies import answering_node, short_reason

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = logging.getLogger(__name__)
T = TypeVar("T", bound="DataclassInstance")


class DiscoveryError(RuntimeError):
    """The federation did not come together as configured."""


def wait_for_nodes(grid: Grid, expected: int, timeout: float, poll_s: float = 1.0,
                   probe: Callable[[list[int]], None] | None = None, settle_s: float = 3.0) -> list[int]:
    """Node ids once ``expected`` nodes are connected; DiscoveryError after ``timeout`` seconds.
    ``probe``: called once with the connected nodes when fewer than ``expected`` have stayed connected
    for ``settle_s`` seconds, to refuse a federation that cannot grow (a simulation, whose nodes all
    register at its start); once, as in a deployment each probe costs the waiting nodes an exchange."""
    deadline = time.monotonic() + timeout
    count, since, probed = -1, time.monotonic(), False
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        now = time.monotonic()
        if len(nodes) != count:
            count, since = len(nodes), now
        elif probe is not None and nodes and not probed and now - since >= settle_s:
            probe(nodes)
            probed = True
        if now >= deadline:
            raise DiscoveryError(
                f"only {len(nodes)} of num_clients={expected} nodes connected within "
                f"server.node_wait_timeout={timeout}s"
            )
        time.sleep(poll_s)


def ask_every_node(grid: Grid, nodes: list[int], message_type: str, content: Callable[[], RecordDict],
                   cls: type[T], timeout: float) -> tuple[dict[int, T], list[str]]:
    """Each answering node's reply payload (as ``cls``) to a query of ``message_type`` with ``content()``,
    and one problem per node that failed; sent by the grid directly, outside any round of the run."""
    what = message_type.split(".")[-1]
    queries = [Message(content=content(), message_type=message_type, dst_node_id=node) for node in nodes]
    replies = list(grid.send_and_receive(queries, timeout=timeout))
    answers: dict[int, T] = {}
    problems = []
    for reply in replies:
        node = answering_node(reply, queries)
        if reply.has_error():
            log.debug("node %d failed the %s query with:\n%s", node, what, reply.error.reason)
            problems.append(f"node {node} failed the {what} query: {short_reason(reply.error.reason)}")
            continue
        try:
            answers[node] = read_reply(reply.content, cls, f"node {node}")
        except ProtocolError as err:
            problems.append(str(err))
    if len(replies) < len(nodes):
        problems.append(f"{len(nodes) - len(replies)} node(s) did not answer the {what} query in time")
    return answers, problems


def node_infos(grid: Grid, nodes: list[int], timeout: float) -> tuple[dict[int, NodeInfo], list[str]]:
    """Each answering node's ``NodeInfo`` to a ``query.info``, and one problem per node that failed."""
    return ask_every_node(grid, nodes, INFO, instruction, NodeInfo, timeout)


def check_federation_size(infos: dict[int, NodeInfo], expected: int) -> None:
    """A simulation's nodes say how many of them there are (``NodeInfo.num_partitions``); a number other
    than ``num_clients`` is refused at once, saying what to set."""
    sizes = sorted({info.num_partitions for info in infos.values()} - {0, expected})
    if sizes:
        raise DiscoveryError(
            f"the simulation has num-supernodes={sizes[0]} nodes but the run has num_clients={expected}: set "
            f"num-supernodes={expected} in the federation config (flwr run . --federation-config "
            f"\"num-supernodes={expected}\"), or num_clients={sizes[0]}"
        )


def discover(grid: Grid, expected: int, wait_timeout: float, reply_timeout: float) -> Federation:
    """Map every connected node to its partition id; the ids must be exactly 0..expected-1."""

    def probe(nodes: list[int]) -> None:
        # Bounded by the node wait: a deployed node slow to answer must not hold up the waiting.
        check_federation_size(node_infos(grid, nodes, min(reply_timeout, wait_timeout))[0], expected)

    nodes = wait_for_nodes(grid, expected, wait_timeout, probe=probe)
    infos, problems = node_infos(grid, nodes, reply_timeout)
    check_federation_size(infos, expected)
    node_of: dict[int, int] = {}
    num_examples: dict[int, int] = {}
    without_state: set[int] = set()
    for node, info in infos.items():
        pid, size = info.partition_id, info.num_examples
        if not 0 <= pid < expected:
            problems.append(f"node {node} reports partition {pid}, outside 0..{expected - 1} (num_clients={expected})")
            continue
        if pid in node_of:
            problems.append(f"nodes {node_of[pid]} and {node} both hold partition {pid}")
        node_of[pid] = node
        num_examples[pid] = size
        if not info.keeps_state:
            without_state.add(pid)
    missing = sorted(set(range(expected)) - set(node_of))
    if missing:
        problems.append(f"no node holds partition(s) {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if problems:
        raise DiscoveryError("; ".join(problems))
    log.info("discovered %d clients holding %d training samples", len(node_of), sum(num_examples.values()))
    return Federation(node_of=dict(sorted(node_of.items())), num_examples=dict(sorted(num_examples.items())),
                      without_state=frozenset(without_state))
