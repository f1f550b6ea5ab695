"""discover: real Ray simulations whose tiny ClientApp answers ``query.info`` like client/app.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from server.discovery import INFO_QUERY, DiscoveryError, discover
from server.simulation_engine import run_simulation_engine

# Ray start-up dominates every run; a hang (e.g. a swallowed ServerApp error) must fail, not stall.
pytestmark = pytest.mark.timeout(120)


def num_examples_of(pid: int) -> int:
    return 100 + 7 * pid


client_app = ClientApp()


@client_app.query("info")
def info(msg: Message, context: Context) -> Message:
    """Report this node's partition, or misbehave the way ``run_config["mode"]`` asks."""
    pid = int(context.node_config["partition-id"])
    mode = context.run_config["mode"]
    if mode == "raise" and pid == 1:
        raise OSError(f"node {context.node_id} cannot read its partition")
    reported = 0 if mode == "duplicate" else pid
    metrics = MetricRecord({"partition-id": reported, "num-examples": num_examples_of(pid)})
    return Message(RecordDict({"info": metrics}), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Discover, then ask each node_of[pid] once more which partition it holds; write it all down."""
    cfg = context.run_config
    federation = discover(grid, int(cfg["expected"]), float(cfg["wait-timeout"]), reply_timeout=60.0)
    queries = [
        Message(RecordDict(), message_type=INFO_QUERY, dst_node_id=federation.node_of[pid])
        for pid in federation.partition_ids
    ]
    rechecks = [
        {"src": reply.metadata.src_node_id, "pid": int(reply.content["info"]["partition-id"])}
        for reply in grid.send_and_receive(queries, timeout=60.0)
    ]
    observed = {
        "connected": sorted(grid.get_node_ids()),
        "partition_ids": federation.partition_ids,
        "node_of": {str(pid): node for pid, node in federation.node_of.items()},
        "num_examples": {str(pid): n for pid, n in federation.num_examples.items()},
        "rechecks": rechecks,
    }
    Path(str(cfg["out"])).write_text(json.dumps(observed))


def simulate(num_nodes: int, expected: int, mode: str, out: Path, wait_timeout: float = 60.0) -> dict:
    run_config = {"out": str(out), "expected": expected, "wait-timeout": wait_timeout, "mode": mode}
    run_simulation_engine(server_app, client_app, num_supernodes=num_nodes, run_config=run_config,
                          num_cpus_per_client=1.0)
    return json.loads(out.read_text())


def test_every_partition_maps_to_the_node_that_holds_it(tmp_path):
    observed = simulate(4, 4, "honest", tmp_path / "observed.json")
    assert observed["partition_ids"] == [0, 1, 2, 3]
    node_of = {int(pid): node for pid, node in observed["node_of"].items()}
    assert sorted(node_of.values()) == observed["connected"]
    # Asking node_of[pid] directly must get pid back, from that very node.
    assert sorted((r["pid"], r["src"]) for r in observed["rechecks"]) == sorted(node_of.items())
    num_examples = {int(pid): n for pid, n in observed["num_examples"].items()}
    assert num_examples == {pid: num_examples_of(pid) for pid in range(4)}


def test_too_few_nodes_fail_after_the_wait_timeout(tmp_path):
    out = tmp_path / "observed.json"
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"only 4 of num_clients=6 nodes connected within .*=3\.0s"):
        simulate(4, 6, "honest", out, wait_timeout=3.0)
    # Ray start-up plus the 3 s wait: nowhere near the 60 s reply timeout.
    assert time.monotonic() - start < 45
    assert not out.exists()


def test_two_nodes_claiming_one_partition_fail_and_name_the_missing_one(tmp_path):
    with pytest.raises(DiscoveryError) as caught:
        simulate(2, 2, "duplicate", tmp_path / "observed.json")
    message = str(caught.value)
    pair = re.search(r"nodes (\d+) and (\d+) both hold partition 0", message)
    assert pair is not None and pair[1] != pair[2], message
    assert "no node holds partition(s) [1]" in message


def test_a_node_whose_info_handler_raises_is_named_with_its_failure(tmp_path):
    # The reason carries the ClientApp's traceback over several lines; \1 ties it to the named node.
    failure = r"(?s)node (\d+) failed the info query: .*node \1 cannot read its partition"
    with pytest.raises(DiscoveryError, match=failure):
        simulate(2, 2, "raise", tmp_path / "observed.json")
