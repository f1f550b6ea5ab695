"""A client's local update as a plain function: global state in, trained state and metrics out.

The ClientApp's train handler and bench/overhead.py's plain PyTorch loop both call it, so the two
run exactly the same computation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from client.node import LocalNode
from client.training import TrainConfig, train_local


def local_update(
    node: LocalNode,
    global_state: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    server_round: int,
    labels: np.ndarray | None = None,
    linear_terms: list[torch.Tensor] | None = None,
) -> tuple[torch.nn.Module, dict[str, float]]:
    """Train from ``global_state`` with ``config`` (TrainConfig keys) on ``labels`` (default: the
    node's own labels; FedCorr passes the corrected ones). ``linear_terms``: FedDyn's correction, one
    tensor per model parameter (see ``train_local``).

    Returns the trained model and the training metrics (``num-examples`` included).
    """
    settings = TrainConfig.from_mapping(config)
    model = node.new_model()
    model.load_state_dict(global_state)
    anchor = [p.detach().clone() for p in model.parameters()] if settings.prox_weight > 0 else None
    metrics = train_local(model, node.data.images, node.data.labels if labels is None else labels,
                          node.train_transform, settings, generator=node.generator(server_round),
                          device=node.device, global_params=anchor, linear_terms=linear_terms)
    return model, metrics


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state as CPU tensors, ready to be sent."""
    return {key: value.detach().cpu() for key, value in model.state_dict().items()}
