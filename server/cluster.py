"""A simulation on a Ray cluster: every node that may run clients must read what a client reads.

A simulated client reads the project's code, the run's scene (``<out_dir>/scene.npz``) and the
dataset, and keeps its state under ``<out_dir>/client_state``; any node may serve any client in any
round. So the cluster's nodes share one filesystem view: the project, the data and the outputs at the
same paths on every node (a shared mount, or the same copies). Before the first round the driver runs
one small task on each node with CPUs that reads all three there, and refuses the run in one line
naming each node that cannot.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from common.errors import InvalidValue
from data.scene import SCENE_FILE, DatasetSource, Scene
from settings.run import RunSettings, anchored

# How long one node may take to answer (its worker starts, imports the project, loads the data once).
NODE_CHECK_TIMEOUT_S = 300.0


def _reads(scene_path: str, dataset: DatasetSource) -> str | None:
    """On one node: None when it reads the scene and the dataset, else what it cannot read."""
    try:
        Scene.load(scene_path)
    except Exception as err:  # noqa: BLE001  (any failure is reported as this node's)
        return f"cannot read the scene {scene_path} ({type(err).__name__}: {_first_line(err)})"
    try:
        dataset.load()
    except Exception as err:  # noqa: BLE001
        return f"cannot load dataset {dataset.name} ({type(err).__name__}: {_first_line(err)})"
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0]


def client_nodes() -> list[dict[str, Any]]:
    """The joined cluster's alive nodes that have CPUs (where client actors can be placed)."""
    return [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0]


def check_fit(nodes: list[dict[str, Any]], settings: RunSettings) -> None:
    """Refuse client resources that no node of the joined cluster can hold (Flower would fail only after
    the ServerApp started); counted per node, as Flower sizes its actor pool."""
    simulation = settings.simulation
    fits = 0
    for node in nodes:
        resources = node.get("Resources", {})
        actors = int(resources.get("CPU", 0) // simulation.num_cpus_per_client)
        if simulation.num_gpus_per_client > 0:
            actors = min(actors, int(resources.get("GPU", 0) // simulation.num_gpus_per_client))
        fits += actors
    if fits == 0:
        largest = max((node["Resources"].get("CPU", 0) for node in nodes), default=0)
        raise InvalidValue("simulation.num_cpus_per_client", simulation.num_cpus_per_client,
                           f"resources one node of the cluster holds (its largest node has {largest:g} CPUs; "
                           f"num_gpus_per_client={simulation.num_gpus_per_client:g})")


def check_nodes(address: str, settings: RunSettings) -> None:
    """Refuse the run unless a client fits on some node of the joined cluster, and every node with CPUs
    reads the project's code, the run's scene and its dataset at the paths this process uses (relative
    ones anchored here)."""
    check_fit(client_nodes(), settings)
    scene_path = str((Path(settings.out_dir) / SCENE_FILE).resolve())
    dataset = anchored(settings, os.getcwd()).scene.dataset
    task = ray.remote(num_cpus=0, max_retries=0)(_reads)
    answers = {}
    for node in client_nodes():
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        answers[node["NodeID"]] = (node["NodeManagerAddress"], task.options(scheduling_strategy=strategy).remote(
            scene_path, dataset))
    problems = []
    for node_id, (host, ref) in answers.items():
        try:
            reason = ray.get(ref, timeout=NODE_CHECK_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001  (a node that cannot even import the project)
            reason = f"cannot run the project's code there ({type(err).__name__}: {_first_line(err)})"
        if reason:
            problems.append(f"node {host} ({node_id[:8]}) {reason}")
    if problems:
        raise InvalidValue("simulation.ray_address", address,
                           "a cluster whose every node reads the project, the data and out_dir at the same paths "
                           f"as this machine (docs/cluster.md); {'; '.join(problems)}")
