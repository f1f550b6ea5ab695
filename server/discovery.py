"""Node discovery: wait for the expected Flower nodes, then learn which partition each one holds.

Flower gives nodes random ids; our clients are partitions 0..N-1. A ``query.info`` round asks every
node for its partition id and local set size.
"""

from __future__ import annotations

import logging
import time

from flwr.app import Message
from flwr.serverapp import Grid

from protocol.codec import ProtocolError
from protocol.messages import INFO, NodeInfo, instruction, read_reply
from strategies.federation import Federation
from strategies.replies import answering_node, short_reason

log = logging.getLogger(__name__)


class DiscoveryError(RuntimeError):
    """The federation did not come together as configured."""


def wait_for_nodes(grid: Grid, expected: int, timeout: float, poll_s: float = 1.0) -> list[int]:
    """Node ids once ``expected`` nodes are connected; DiscoveryError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if time.monotonic() >= deadline:
            raise DiscoveryError(
                f"only {len(nodes)} of num_clients={expected} nodes connected within "
                f"server.node_wait_timeout={timeout}s"
            )
        time.sleep(poll_s)


def discover(grid: Grid, expected: int, wait_timeout: float, reply_timeout: float) -> Federation:
    """Map every connected node to its partition id; the ids must be exactly 0..expected-1."""
    nodes = wait_for_nodes(grid, expected, wait_timeout)
    queries = [Message(content=instruction(), message_type=INFO, dst_node_id=node) for node in nodes]
    replies = list(grid.send_and_receive(queries, timeout=reply_timeout))
    node_of: dict[int, int] = {}
    num_examples: dict[int, int] = {}
    without_state: set[int] = set()
    problems = []
    for reply in replies:
        node = answering_node(reply, queries)
        if reply.has_error():
            log.debug("node %d failed the info query with:\n%s", node, reply.error.reason)
            problems.append(f"node {node} failed the info query: {short_reason(reply.error.reason)}")
            continue
        try:
            info = read_reply(reply.content, NodeInfo, f"node {node}")
        except ProtocolError as err:
            problems.append(str(err))
            continue
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
    if len(replies) < len(nodes):
        problems.append(f"{len(nodes) - len(replies)} node(s) did not answer the info query in time")
    missing = sorted(set(range(expected)) - set(node_of))
    if missing:
        problems.append(f"no node holds partition(s) {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if problems:
        raise DiscoveryError("; ".join(problems))
    log.info("discovered %d clients holding %d training samples", len(node_of), sum(num_examples.values()))
    return Federation(node_of=dict(sorted(node_of.items())), num_examples=dict(sorted(num_examples.items())),
                      without_state=frozenset(without_state))
