"""A finished run's folder read back for offline replays: the labels its clients stored, and its global
model at a checkpointed round with each client's data and the transforms the clients scored it with."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from runs import ConfigError

from client.label_state import LABELS_KEY
from client.state_store import versions
from common.atomic_files import read_npz
from data.client_data import ClientData, client_data
from data.scene import SCENE_FILE, Scene
from data.sources.base import Dataset
from data.transforms import BatchTransform
from server.checkpoints import CheckpointStore, read_checkpoint
from settings.run import run_settings
from task.build import model_for, transforms_for
from task.evaluation import evaluate, loss_and_proba
from task.scores import Scores


def label_version(run_dir: Path, client: int, before: int | None) -> tuple[int, np.ndarray] | None:
    """The newest stored labels of ``client`` (before round ``before`` when given), with their round."""
    folders = sorted((run_dir / "client_state").glob(f"run-*/partition-{client}/{LABELS_KEY}"))
    found = [version for folder in folders for version in versions(folder)
             if before is None or version.round < before]
    if not found:
        return None
    newest = max(found, key=lambda version: (version.round, version.attempt))  # a resumed run's own version last
    return newest.round, read_npz(newest.path)["labels"]


def last_round(payload: dict[str, Any], stage: str) -> int:
    """The last round of ``stage`` in a run's results."""
    return max(row["round"] for row in payload["rounds"] if row.get("stage") == stage)


@dataclass(frozen=True)
class GlobalModel:
    """A run's global model at one round, with what scoring it on a client's samples needs."""

    model: torch.nn.Module
    num_clients: int
    scene: Scene
    dataset: Dataset
    evaluation: BatchTransform

    @classmethod
    def at(cls, run_dir: Path, payload: dict[str, Any], server_round: int, what: str) -> GlobalModel:
        """The global model checkpointed at ``server_round`` (``what`` names it in the error when the run
        kept no checkpoint there)."""
        checkpoint = CheckpointStore(run_dir).at(server_round)
        if checkpoint is None:
            raise ConfigError(f"RUN_DIR={run_dir} is invalid: it keeps no checkpoint of {what} (round {server_round})")
        settings = run_settings(payload["config"])
        dataset = settings.scene.dataset.load()
        model = model_for(settings.model, dataset, settings.transforms)
        model.load_state_dict(read_checkpoint(checkpoint).global_arrays().to_torch_state_dict())
        _, evaluation = transforms_for(settings.transforms, dataset)
        return cls(model, settings.num_clients, Scene.load(run_dir / SCENE_FILE), dataset, evaluation)

    def clients(self) -> Iterator[tuple[int, ClientData]]:
        """Every client's partition id and data, in order."""
        for client in range(self.num_clients):
            yield client, client_data(self.scene, self.dataset, client)

    def scores(self, data: ClientData, labels: np.ndarray) -> Scores:
        """The model's loss and accuracy on the client's samples with ``labels``, as the client's own
        ``query.loss`` computes them."""
        return evaluate(self.model, data.images, labels, self.evaluation)

    def probabilities(self, data: ClientData, labels: np.ndarray) -> np.ndarray:
        """The model's softmax outputs on the client's samples (evaluation transforms)."""
        return loss_and_proba(self.model, data.images, labels, self.evaluation)[1]
