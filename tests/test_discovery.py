"""Node discovery over the in-process test grid: the real ClientApp's ``query.info`` handler, and nodes
that misbehave (two claiming one partition, one whose handler raises, too few connected)."""

from __future__ import annotations

import re
import time

import pytest
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from protocol.messages import INFO, NodeInfo, instruction, read_reply, reply
from server.discovery import DiscoveryError, discover


@pytest.fixture(scope="module")
def run(prepared_run):
    return prepared_run("experiment=smoke")


def test_every_partition_maps_to_the_node_that_holds_it(run, local_grid):
    overrides, scene, _ = run
    grid = local_grid(overrides, 10)
    federation = discover(grid, 10, wait_timeout=1.0, reply_timeout=1.0)
    assert federation.partition_ids == list(range(10))
    assert federation.node_of == {pid: grid.node_of(pid) for pid in range(10)}
    assert federation.num_examples == {pid: int(scene.client_sizes()[pid]) for pid in range(10)}
    # Asking node_of[pid] directly gets pid back, from that very node.
    queries = [Message(instruction(), message_type=INFO, dst_node_id=federation.node_of[pid]) for pid in range(10)]
    for answer in grid.send_and_receive(queries):
        info = read_reply(answer.content, NodeInfo, "node")
        assert answer.metadata.src_node_id == federation.node_of[info.partition_id]


def test_too_few_nodes_fail_after_the_wait_timeout(run, local_grid):
    overrides, _, _ = run
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"only 4 of num_clients=6 nodes connected within .*=0\.2s"):
        discover(local_grid(overrides, 4), 6, wait_timeout=0.2, reply_timeout=1.0)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("num_nodes", [4, 8])
def test_a_simulation_of_another_size_is_refused_at_once_saying_what_to_set(run, local_grid, num_nodes):
    """Virtual nodes tell how many of them the runtime was given; fewer than num_clients cannot grow, so
    discovery refuses them once they have settled (seconds, not the 120 s node wait), as it refuses
    more at once."""
    overrides, _, _ = run
    start = time.monotonic()
    with pytest.raises(DiscoveryError) as caught:
        discover(local_grid(overrides, num_nodes), 6, wait_timeout=60.0, reply_timeout=5.0)
    assert str(caught.value) == (f"the simulation has num-supernodes={num_nodes} nodes but the run has num_clients=6: "
                                 'set num-supernodes=6 in the federation config (flwr run . --federation-config '
                                 f'"num-supernodes=6"), or num_clients={num_nodes}')
    assert time.monotonic() - start < 30


def test_deployed_nodes_say_nothing_of_the_federations_size(run, local_grid):
    """A deployed SuperNode has no num-partitions: it reports 0 and discovery waits for the others."""
    overrides, _, _ = run
    grid = local_grid(overrides, 2, node_configs={pid: {"num-partitions": None} for pid in range(2)})
    queries = [Message(instruction(), message_type=INFO, dst_node_id=grid.node_of(pid)) for pid in range(2)]
    infos = [read_reply(answer.content, NodeInfo, "node") for answer in grid.send_and_receive(queries)]
    assert {info.num_partitions for info in infos} == {0}
    with pytest.raises(DiscoveryError, match=r"only 2 of num_clients=3 nodes connected"):
        discover(grid, 3, wait_timeout=0.5, reply_timeout=1.0)


def test_two_nodes_claiming_one_partition_fail_and_name_the_missing_one(run, local_grid):
    overrides, _, _ = run
    grid = local_grid(overrides, 3, node_configs={1: {"partition-id": 0}})
    with pytest.raises(DiscoveryError) as caught:
        discover(grid, 3, wait_timeout=1.0, reply_timeout=1.0)
    message = str(caught.value)
    pair = re.search(r"nodes (\d+) and (\d+) both hold partition 0", message)
    assert pair is not None and {int(pair[1]), int(pair[2])} == {grid.node_of(0), grid.node_of(1)}, message
    assert "no node holds partition(s) [1]" in message


raising_app = ClientApp()


@raising_app.query("info")
def info(message: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    if pid == 1:
        raise OSError(f"node {context.node_id} cannot read its partition")
    return Message(reply(NodeInfo(pid, 10, 1)), reply_to=message)


def test_a_node_whose_info_handler_raises_is_named_with_its_failure(local_grid):
    grid = local_grid("", 2, client_app=raising_app)
    failure = (rf"node {grid.node_of(1)} failed the info query: "
               rf"OSError: node {grid.node_of(1)} cannot read its partition")
    with pytest.raises(DiscoveryError, match=failure):
        discover(grid, 2, wait_timeout=1.0, reply_timeout=1.0)


def test_a_node_that_does_not_answer_and_a_bad_info_reply_are_named(run, local_grid):
    overrides, _, _ = run
    grid = local_grid(overrides, 3)
    grid.silent.add(grid.node_of(2))
    with pytest.raises(DiscoveryError,
                       match=r"1 node\(s\) did not answer the info query in time; no node holds partition\(s\) \[2\]"):
        discover(grid, 3, wait_timeout=1.0, reply_timeout=1.0)

    bad_app = ClientApp()

    @bad_app.query("info")
    def bad_info(message: Message, context: Context) -> Message:
        content = reply(NodeInfo(int(context.node_config["partition-id"]), 10, 1))
        del content["metrics"]["num-examples"]
        return Message(content, reply_to=message)

    grid = local_grid("", 1, client_app=bad_app)
    with pytest.raises(DiscoveryError,
                       match=rf"node {grid.node_of(0)} sent a bad message: key 'num-examples' is missing"):
        discover(grid, 1, wait_timeout=1.0, reply_timeout=1.0)
