"""run_simulation_engine: real Ray simulations of a tiny ServerApp/ClientApp pair defined here."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import ray
from defaults import composed
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from common.errors import ConfigError
from common.validation import from_mapping
from server.simulation_engine import run_simulation_engine
from settings.run import SimulationSettings

NUM_NODES = 3
# conf/'s simulation settings: one CPU per client, no GPU.
SIMULATION = from_mapping(SimulationSettings, composed()["simulation"], "simulation")
# Generous: each actor unpickles the ClientApp, so it imports this module (torch, Flower, a composition);
# on a loaded 2-core machine that took over 180 s once.
REPLY_TIMEOUT = 420.0

client_app = ClientApp()


@client_app.query("info")
def info(msg: Message, context: Context) -> Message:
    """Report what this node was given: its partition, the run config and its Ray resources."""
    assigned = ray.get_runtime_context().get_assigned_resources()
    answer = ConfigRecord({
        "partition-id": context.node_config["partition-id"],
        "num-partitions": context.node_config["num-partitions"],
        "token": context.run_config["token"],
        "cpus": float(assigned.get("CPU", 0.0)),
        "gpus": float(assigned.get("GPU", 0.0)),
    })
    return Message(RecordDict({"info": answer}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    raise ValueError(f"partition {context.node_config['partition-id']} has a bad batch")


def wait_for_nodes(grid: Grid, expected: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {expected} nodes connected")
        time.sleep(0.05)
    return nodes


def ask_all(grid: Grid, nodes: list[int], message_type: str) -> list[Message]:
    queries = [Message(RecordDict(), dst_node_id=node, message_type=message_type) for node in nodes]
    return list(grid.send_and_receive(queries, timeout=REPLY_TIMEOUT))


def own_sigterm(signum: int, frame: object) -> None:
    """A command's own SIGTERM handler, as ``server.interrupt`` installs one (never called here)."""


recording_server = ServerApp()


@recording_server.main()
def record(grid: Grid, context: Context) -> None:
    """Ask every node for its info, then make every node's training fail; write what came back."""
    nodes = wait_for_nodes(grid, int(context.run_config["num-nodes"]))
    infos = [dict(reply.content["info"]) for reply in ask_all(grid, nodes, "query.info")]
    errors = [
        {"code": reply.error.code, "reason": reply.error.reason} if reply.has_error() else None
        for reply in ask_all(grid, nodes, "train")
    ]
    payload = {"server_run_config": dict(context.run_config), "infos": infos, "train_errors": errors,
               "own_sigterm_handler": signal.getsignal(signal.SIGTERM) is own_sigterm}
    Path(str(context.run_config["out"])).write_text(json.dumps(payload))


failing_server = ServerApp()


@failing_server.main()
def fail(grid: Grid, context: Context) -> None:
    raise LookupError(f"no strategy named {context.run_config['strategy']!r}")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    run_config = {"out": str(tmp_path_factory.mktemp("sim") / "record.json"), "token": "t-42", "num-nodes": NUM_NODES}
    before = signal.signal(signal.SIGTERM, own_sigterm)
    path = os.environ.get("PYTHONPATH")
    try:
        run_simulation_engine(recording_server, client_app, num_supernodes=NUM_NODES, run_config=run_config,
                              simulation=SIMULATION)
    finally:
        signal.signal(signal.SIGTERM, before)
    payload = json.loads(Path(run_config["out"]).read_text())
    return run_config, {**payload, "pythonpath_kept": os.environ.get("PYTHONPATH") == path}


def test_the_server_app_sees_the_run_config(recorded):
    run_config, payload = recorded
    assert payload["server_run_config"] == run_config


def test_the_commands_own_sigterm_handler_holds_while_the_clients_train(recorded):
    # ray.init replaces it with Ray's, which unwinds the run without muting Flower's log of each message
    # the shut-down cuts short; the engine puts the command's back once Ray has started.
    assert recorded[1]["own_sigterm_handler"]


def test_every_client_app_sees_the_run_config_its_partition_and_our_resources(recorded):
    _, payload = recorded
    infos = sorted(payload["infos"], key=lambda info: info["partition-id"])
    assert [info["partition-id"] for info in infos] == list(range(NUM_NODES))
    assert {(info["num-partitions"], info["token"], info["cpus"], info["gpus"]) for info in infos} == {
        (NUM_NODES, "t-42", 1.0, 0.0)
    }


def test_the_import_path_reaches_the_actors_and_this_process_keeps_its_environment(recorded):
    # The actors unpickled this module's ClientApp, so they found it on the path Ray's start gave them;
    # that path is set in this process's environment for the start alone.
    assert len(recorded[1]["infos"]) == NUM_NODES
    assert recorded[1]["pythonpath_kept"]


def test_a_client_app_exception_is_an_error_reply_not_a_hang(recorded):
    _, payload = recorded
    errors = payload["train_errors"]
    assert len(errors) == NUM_NODES
    assert all(error is not None and error["code"] == ErrorCode.CLIENT_APP_RAISED_EXCEPTION for error in errors)
    reasons = " ".join(error["reason"] for error in errors)
    assert all(f"partition {p} has a bad batch" in reasons for p in range(NUM_NODES))


def test_a_server_app_exception_reaches_the_caller_and_ray_is_shut_down(recorded):
    assert not ray.is_initialized()  # the recording run above shut Ray down too
    with pytest.raises(LookupError, match="no strategy named 'fedbogus'"):
        run_simulation_engine(failing_server, client_app, num_supernodes=2, run_config={"strategy": "fedbogus"},
                              simulation=SIMULATION)
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "arguments,message",
    [
        ({"num_supernodes": 0}, r"num_supernodes=0 is invalid"),
        ({"run_config": {"lr": [0.1]}}, r"run_config\['lr'\]=\[0.1\] is invalid"),
    ],
)
def test_bad_arguments_are_one_clear_error_before_ray_starts(arguments, message):
    kwargs = {"num_supernodes": 2, "run_config": {}, "simulation": SIMULATION} | arguments
    with pytest.raises(ConfigError, match=message):
        run_simulation_engine(failing_server, client_app, **kwargs)
    assert not ray.is_initialized()

