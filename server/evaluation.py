"""Central evaluation of the global model on the dataset's test split."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord
from omegaconf import DictConfig

from client.evaluation import evaluate
from client.setup import configured_model, configured_transforms, resolve_device
from data.sources.base import Dataset


class CentralEvaluator:
    """Loads global arrays into one model kept for the run and scores it on the test split."""

    def __init__(self, cfg: DictConfig, dataset: Dataset) -> None:
        self.device = resolve_device(cfg.server.device)
        self.model = configured_model(cfg, dataset).to(self.device)
        _, self.transform = configured_transforms(cfg, dataset)
        self.test = dataset.test
        self.batch_size = int(cfg.server.eval_batch_size)

    def __call__(self, arrays: ArrayRecord) -> dict[str, float]:
        """{"loss", "accuracy", "num-examples"} of the model given by ``arrays`` on the test split."""
        self.model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return evaluate(self.model, self.test.images, self.test.labels, self.transform,
                            batch_size=self.batch_size, device=self.device)
