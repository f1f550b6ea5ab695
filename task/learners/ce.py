"""Cross-entropy on the given labels: plain local SGD (FedAvg's learner)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from task.learners.base import Batch, BatchLoss


class CrossEntropy:
    """CE(f(x), y), averaged over the batch."""

    def __call__(self, model: nn.Module, batch: Batch) -> BatchLoss:
        """The batch's cross-entropy."""
        loss = F.cross_entropy(model(batch.inputs()), batch.labels)
        return BatchLoss(loss, loss)
