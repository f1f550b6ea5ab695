"""A client's local update as a plain function: global state in, trained model and stats out.

The plug-ins (plain training included) and bench/throughput.py's sequential loop all call it,
so they run exactly the same computation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from client.node import LocalNode
from task.hooks import TrainingHooks
from task.local_training import TrainStats
from task.training import train_local


def local_update(node: LocalNode, global_state: Mapping[str, torch.Tensor], hooks: TrainingHooks,
                 server_round: int, labels: np.ndarray | None = None) -> tuple[torch.nn.Module, TrainStats]:
    """Train from ``global_state`` as ``hooks`` say on ``labels`` (default: the node's own labels;
    FedCorr passes the corrected ones), with the node's random stream for this round."""
    model = node.model_for_state(global_state.keys())
    model.load_state_dict(global_state)
    stats = train_local(model, node.data.images, node.data.labels if labels is None else labels,
                        node.train_transform, hooks, generator=node.generator(server_round), device=node.device)
    return model, stats


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state as CPU tensors, ready to be sent."""
    return {key: value.detach().cpu() for key, value in model.state_dict().items()}
