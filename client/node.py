"""What a client node holds for a run: its settings, its partition's data, transforms, device, and a
model factory.

Simulation: the node's ``partition-id`` (from Flower's node config) selects its slice of the scene
in ``<out_dir>/scene.npz``. Deployment: the node's ``data-path`` names its own local data file
(data.local_file), whose meta carries the partition id; its data never leaves the node. Loading is
cached per process: Ray keeps client actors alive between messages, so a simulated client reads its
data once, not once per round.

Whether the node may send ground-truth diagnostics (counts of its labels against their true labels)
is the node's own decision, ``sends_ground_truth``: its node config's ``ground-truth-diagnostics``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from flwr.app import Context

from common.errors import ConfigError
from common.seeding import rng_for
from common.validation import Flag
from data.client_data import ClientData, client_data
from data.local_file import read_local_file
from data.scene import SCENE_FILE, Scene
from data.sources.base import Dataset
from data.transforms import BatchTransform
from settings.compose import RUN_CONFIG_KEY, WORKDIR_KEY, compose_from_run_config
from settings.run import RunSettings, anchored, run_settings
from task.build import model_for, model_for_state, transforms_for
from task.device import resolve_device

PARTITION_ID_KEY = "partition-id"
DATA_PATH_KEY = "data-path"
NUM_PARTITIONS_KEY = "num-partitions"
"""Flower's simulation runtime gives every virtual node ``partition-id`` and ``num-partitions``;
``deploy/supernode.sh`` never gives ``num-partitions``."""
DIAGNOSTICS_KEY = "ground-truth-diagnostics"
"""Node config: true lets the node send ground-truth diagnostics when a run asks; false never."""


@dataclass(frozen=True)
class LocalNode:
    """One client's local view of the run."""

    partition_id: int
    settings: RunSettings
    dataset: Dataset
    data: ClientData
    train_transform: BatchTransform
    eval_transform: BatchTransform
    device: torch.device

    def new_model(self) -> torch.nn.Module:
        """A freshly initialised model of the run's architecture for this dataset, on the node's device."""
        return model_for(self.settings.model, self.dataset, self.settings.transforms).to(self.device)

    def model_for_state(self, state_keys: Iterable[str]) -> torch.nn.Module:
        """A fresh model that loads a state with ``state_keys`` (a ``PeerPair`` for a pair's), on the
        node's device."""
        return model_for_state(self.settings.model, self.dataset, self.settings.transforms,
                               state_keys).to(self.device)

    @functools.cached_property
    def parameter_names(self) -> list[str]:
        """The model's trainable parameters by name, in ``parameters()`` order (the state dict also
        holds buffers). Built once per cached node, not once per round."""
        return [name for name, _ in self.new_model().named_parameters()]

    def generator(self, server_round: int, purpose: str = "train") -> torch.Generator:
        """A torch generator for this client, round and purpose, derived from the run's seed, so
        results do not depend on which process or in which order clients run."""
        seed = int(rng_for(self.settings.seed, f"{purpose}/{server_round}/{self.partition_id}").integers(2**63))
        return torch.Generator().manual_seed(seed)


@functools.lru_cache(maxsize=4)
def _scene(out_dir: str) -> Scene:
    return Scene.load(Path(out_dir) / SCENE_FILE)


@functools.lru_cache(maxsize=8)
def _settings(overrides: str, workdir: str = "") -> RunSettings:
    settings = run_settings(compose_from_run_config({RUN_CONFIG_KEY: overrides}))
    return anchored(settings, workdir) if workdir else settings


def _node(settings: RunSettings, dataset: Dataset, data: ClientData, partition_id: int) -> LocalNode:
    train_transform, eval_transform = transforms_for(settings.transforms, dataset)
    return LocalNode(partition_id, settings, dataset, data, train_transform, eval_transform,
                     resolve_device(settings.client.device))


@functools.lru_cache(maxsize=256)
def _load_partition(overrides: str, partition_id: int, workdir: str) -> LocalNode:
    settings = _settings(overrides, workdir)
    torch.set_num_threads(settings.client.num_threads)
    dataset = settings.scene.dataset.load()
    return _node(settings, dataset, client_data(_scene(settings.out_dir), dataset, partition_id), partition_id)


@functools.lru_cache(maxsize=4)
def _load_file(overrides: str, data_path: str) -> LocalNode:
    settings = _settings(overrides)
    dataset, data, partition_id = read_local_file(data_path)
    # Transforms and the model's shape come from the run's dataset config: the file must be that data.
    expected = settings.scene.dataset
    if dataset.name != expected.name or dataset.num_classes != expected.num_classes:
        raise ConfigError(
            f"local data file {data_path} holds {dataset.name} with {dataset.num_classes} classes, but the run "
            f"is configured for dataset={expected.name} with {expected.num_classes} classes"
        )
    return _node(settings, dataset, data, partition_id)


def load_node(context: Context) -> LocalNode:
    """The node's data and settings for the run described by ``context``: from its local data file
    when node_config has ``data-path``, else its ``partition-id``'s slice of the simulation scene."""
    overrides = str(context.run_config.get(RUN_CONFIG_KEY, ""))
    node_config = context.node_config
    if DATA_PATH_KEY in node_config:
        node = _load_file(overrides, str(Path(str(node_config[DATA_PATH_KEY])).expanduser().absolute()))
        if PARTITION_ID_KEY in node_config and int(node_config[PARTITION_ID_KEY]) != node.partition_id:
            raise ConfigError(
                f"node_config {PARTITION_ID_KEY}={node_config[PARTITION_ID_KEY]} disagrees with the partition id "
                f"{node.partition_id} in {DATA_PATH_KEY}={node_config[DATA_PATH_KEY]}; drop {PARTITION_ID_KEY} "
                "or make them agree"
            )
        return node
    if PARTITION_ID_KEY in node_config:
        return _load_partition(overrides, int(node_config[PARTITION_ID_KEY]),
                               str(context.run_config.get(WORKDIR_KEY, "")))
    raise ConfigError(
        f"node_config has neither {DATA_PATH_KEY!r} nor {PARTITION_ID_KEY!r} (got {dict(node_config)}); start a "
        f"deployed SuperNode with --node-config '{DATA_PATH_KEY}=\"/path/to/client_K.npz\"' (its local data "
        f"file), or give a simulated node '{PARTITION_ID_KEY}=K'"
    )


def simulated_federation_size(context: Context) -> int:
    """How many virtual nodes Flower's simulation runtime was asked for (``num-partitions`` of a node
    without a local data file); 0 for a deployed node."""
    config = context.node_config
    return int(config[NUM_PARTITIONS_KEY]) if NUM_PARTITIONS_KEY in config and DATA_PATH_KEY not in config else 0


def sends_ground_truth(context: Context) -> bool:
    """Whether this node may send ground-truth diagnostics (counts of its labels against their true
    labels) when a run asks for them: its node config's ``ground-truth-diagnostics`` (true or false,
    else an ``InvalidValue``). Without that key only a virtual node of Flower's simulation runtime
    sends them (``partition-id`` and ``num-partitions``, no ``data-path``): its labels and their truth
    are the scene the server itself built. A deployed node sends none unless its operator sets the key
    true (``deploy/supernode.sh --ground-truth-diagnostics``)."""
    config = context.node_config
    if DIAGNOSTICS_KEY in config:
        value = config[DIAGNOSTICS_KEY]
        Flag().check(f"node_config.{DIAGNOSTICS_KEY}", value)
        return bool(value)
    return PARTITION_ID_KEY in config and NUM_PARTITIONS_KEY in config and DATA_PATH_KEY not in config
