"""Simulations on a real two-node Ray cluster on this machine: a head and a second node, each started
with ``ray start --block`` and 1 CPU from a folder of its own (as a node on another machine would start
elsewhere), each stopped by its own pid. The cluster keeps its files in a temp folder of its own: in
Ray's default one, its address would outlive it in /tmp/ray/ray_current_cluster, where any later
``ray.init()`` without an address (``flwr run``'s) would try to join the stopped cluster for ever.

A run that joins the cluster (``simulation.ray_address``) has its client actors on both nodes and
computes what the run computes on one machine (the reference: the in-process run of the same
overrides, which equals the single-machine Ray simulation bit for bit, tests/e2e/test_resume_multirun_e2e.py);
a node that cannot read the run's scene is named in one line; and a multirun with ``--jobs 2
--cluster`` runs each job as a Ray task on its own node with the results of the same runs made one
after another."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import inprocess
import pytest
from commands import REPO

RAY = str(Path(sys.executable).parent / "ray")
SMOKE_FEDCORR = ["experiment=smoke"]
NODE_START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _python(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter (so this process never joins the cluster itself)."""
    return subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


ALIVE_NODES = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0))
"""

CLIENT_ACTOR_NODES = """
import json, sys, ray
from ray._private import state  # the GCS actor table (dead actors included); ray.util.state needs a dashboard
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps(sorted({actor["Address"]["NodeID"] for actor in state.actors().values()
                         if actor["ActorClassName"] == "ClientAppActor"})))
"""

CHECK_NODES = """
import sys, ray
sys.path.insert(0, ".")
from common.errors import ConfigError
from server.cluster import check_nodes
from settings.compose import compose_config
from settings.run import run_settings
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
try:
    check_nodes(sys.argv[1], run_settings(compose_config(["experiment=smoke", f"out_dir={sys.argv[2]}"])))
except ConfigError as err:
    print(f"error: {err}")
"""


def _stop(process: subprocess.Popen) -> None:
    """Stop one ``ray start --block`` by its pid (it stops the node's own processes)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[str]:
    """The address of a two-node cluster, 1 CPU per node."""
    folder = tmp_path_factory.mktemp("ray-nodes")
    # Short: Ray's socket paths live under it, and a Unix socket's path is at most 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    nodes: list[subprocess.Popen] = []
    head = ["--head", "--port", address.rpartition(":")[2], "--include-dashboard=false", "--temp-dir", temp_dir]
    try:
        for name, role in (("head", head), ("second", ["--address", address])):
            (folder / name).mkdir()
            log = open(folder / f"{name}.log", "w")  # noqa: SIM115  (the node writes it while it lives)
            nodes.append(subprocess.Popen([RAY, "start", "--block", "--num-cpus", "1", *role], cwd=folder / name,
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
            deadline = time.monotonic() + NODE_START_TIMEOUT_S
            while True:
                alive = _python(ALIVE_NODES, address) if name == "second" or _port_open(address) else None
                if alive is not None and alive.returncode == 0 and int(alive.stdout.split()[-1]) == len(nodes):
                    break
                assert nodes[-1].poll() is None, (folder / f"{name}.log").read_text()[-2000:]
                assert time.monotonic() < deadline, f"the {name} node did not join within {NODE_START_TIMEOUT_S} s"
                time.sleep(1)
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _sim(cwd: Path, *words: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``sim.py`` started from ``cwd`` (relative out_dirs land there, and a client on a node that
    started elsewhere must still find them)."""
    return subprocess.run([sys.executable, str(REPO / "sim.py"), *words], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _rounds(payload: dict) -> list[tuple]:
    return [(r["round"], r["stage"], r["clients"], r["test_acc"], r["train_loss"]) for r in payload["rounds"]]


def test_a_run_on_the_cluster_uses_both_nodes_and_equals_the_local_run(cluster, tmp_path):
    done = _sim(tmp_path, *SMOKE_FEDCORR, f"simulation.ray_address={cluster}", "out_dir=on-cluster")
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads((tmp_path / "on-cluster" / "results.json").read_text())
    assert ran["complete"] and ran["config"]["simulation"]["ray_address"] == cluster
    actors = _python(CLIENT_ACTOR_NODES, cluster)
    assert actors.returncode == 0, actors.stderr[-2000:]
    assert len(json.loads(actors.stdout.splitlines()[-1])) == 2, "the clients' actors ran on both nodes"
    alone = inprocess.run([*SMOKE_FEDCORR, f"out_dir={tmp_path / 'alone'}"])
    assert _rounds(ran) == _rounds(alone)
    assert ran["fedcorr"]["detection"] == alone["fedcorr"]["detection"]


def test_a_node_that_cannot_read_the_scene_is_named_in_one_line(cluster, tmp_path):
    checked = _python(CHECK_NODES, cluster, str(tmp_path / "no-scene-here"))
    assert checked.returncode == 0, checked.stderr[-2000:]
    [line] = [line for line in checked.stdout.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: simulation.ray_address='{cluster}' is invalid:")
    assert line.count("cannot read the scene") == 2, "both nodes are named"


def test_a_multirun_runs_its_jobs_as_tasks_on_the_cluster(cluster, tmp_path):
    # Three rounds of one local epoch: where the jobs ran and what they computed show in any length of run.
    run = ["experiment=smoke", "strategy=fedavg", "strategy.num_rounds=3", "strategy.train.epochs=1"]
    done = _sim(tmp_path, "-m", *run, "seed=1,2", "out_dir=jobs/s${seed}",
                "hydra.sweep.dir=sweep", "--jobs", "2", "--cluster", cluster, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ended = [line for line in done.stdout.splitlines() if "ended with status 0 on node" in line]
    assert len(ended) == 2 and len({line.rpartition("(")[2] for line in ended}) == 2, "one job on each node"
    listed = sorted((tmp_path / "sweep" / "runs.txt").read_text().split())
    assert listed == [str(tmp_path / "jobs" / f"s{seed}") for seed in (1, 2)]
    for seed in (1, 2):
        ran = json.loads((tmp_path / "jobs" / f"s{seed}" / "results.json").read_text())
        alone = inprocess.run([*run, f"seed={seed}", f"out_dir={tmp_path / f'alone{seed}'}"])
        assert _rounds(ran) == _rounds(alone)
