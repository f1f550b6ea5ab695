"""Central evaluation of the global model on the dataset's test split."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord

from data.sources.base import Dataset
from settings.run import RunSettings
from task.build import model_for, model_for_state, transforms_for
from task.device import resolve_device, torch_threads
from task.evaluation import evaluate_by_class
from task.scores import Scores


class CentralEvaluator:
    """Loads global arrays into a model kept for the run and scores it on the test split; the
    model is rebuilt when the arrays change shape (Co-teaching's pair)."""

    def __init__(self, settings: RunSettings, dataset: Dataset) -> None:
        self.device = resolve_device(settings.server.device)
        self.settings = settings
        self.dataset = dataset
        self.model = model_for(settings.model, dataset, settings.transforms).to(self.device)
        self.keys = list(self.model.state_dict())  # the state the model loads; rebuilt when it changes
        _, self.transform = transforms_for(settings.transforms, dataset)
        self.test = dataset.test
        self.batch_size = settings.server.eval_batch_size
        self.threads = settings.server.num_threads

    def __call__(self, arrays: ArrayRecord) -> tuple[Scores, np.ndarray | None]:
        """The scores of the model given by ``arrays`` on the test split and its confusion matrix
        (``evaluate_by_class``)."""
        state = arrays.to_torch_state_dict()
        if list(state) != self.keys:
            self.model = model_for_state(self.settings.model, self.dataset, self.settings.transforms,
                                         state).to(self.device)
            self.keys = list(state)
        self.model.load_state_dict(state)
        with torch.no_grad(), torch_threads(self.threads):
            return evaluate_by_class(self.model, self.test.images, self.test.labels, self.transform,
                            batch_size=self.batch_size, device=self.device)
