"""What a client node holds for a run: its partition's data, transforms, device, and a model factory.

Simulation: the node's ``partition-id`` (from Flower's node config) selects its slice of the scene
in ``<out_dir>/scene.npz``. Loading is cached per process: Ray keeps client actors alive between
messages, so a simulated client reads its data once, not once per round.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from flwr.app import Context
from omegaconf import DictConfig

from client.setup import configured_model, configured_transforms, resolve_device
from conf import RUN_CONFIG_KEY, compose_from_run_config
from data.client_data import ClientData, client_data
from data.errors import ConfigError
from data.scene import SCENE_FILE, Scene, load_configured_dataset
from data.seeding import rng_for
from data.sources.base import Dataset
from data.transforms import BatchTransform

PARTITION_ID_KEY = "partition-id"


@dataclass(frozen=True)
class LocalNode:
    """One client's local view of the run."""

    partition_id: int
    cfg: DictConfig
    dataset: Dataset
    data: ClientData
    train_transform: BatchTransform
    eval_transform: BatchTransform
    device: torch.device

    def new_model(self) -> torch.nn.Module:
        return configured_model(self.cfg, self.dataset).to(self.device)

    def generator(self, server_round: int, purpose: str = "train") -> torch.Generator:
        """A torch generator for this client, round and purpose, derived from the run's seed, so
        results do not depend on which process or in which order clients run."""
        seed = int(rng_for(self.cfg.seed, f"{purpose}/{server_round}/{self.partition_id}").integers(2**63))
        return torch.Generator().manual_seed(seed)


@functools.lru_cache(maxsize=4)
def _scene(out_dir: str) -> Scene:
    return Scene.load(Path(out_dir) / SCENE_FILE)


@functools.lru_cache(maxsize=256)
def _load(overrides: str, partition_id: int) -> LocalNode:
    cfg = compose_from_run_config({RUN_CONFIG_KEY: overrides})
    torch.set_num_threads(max(1, int(cfg.simulation.num_cpus_per_client)))
    dataset = load_configured_dataset(cfg)
    train_transform, eval_transform = configured_transforms(cfg, dataset)
    return LocalNode(partition_id, cfg, dataset, client_data(_scene(cfg.out_dir), dataset, partition_id),
                     train_transform, eval_transform, resolve_device(cfg.client.device))


def load_node(context: Context) -> LocalNode:
    """This node's data and settings for the run described by ``context``."""
    if PARTITION_ID_KEY not in context.node_config:
        raise ConfigError(
            f"node_config has no {PARTITION_ID_KEY!r} (got {dict(context.node_config)}); "
            "start the SuperNode with --node-config 'partition-id=K'"
        )
    return _load(str(context.run_config.get(RUN_CONFIG_KEY, "")), int(context.node_config[PARTITION_ID_KEY]))
