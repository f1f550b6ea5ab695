"""A client's local update as a plain function: global state in, trained model and stats out.

The plain training of the ClientApp, the method plug-ins and bench/overhead.py's sequential PyTorch
loop all call it, so they run exactly the same computation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from client.node import LocalNode
from task.learner_options import LearnerSchedule
from task.learners import Learner
from task.local_training import LocalTraining, TrainStats
from task.training import train_local


def local_update(
    node: LocalNode,
    global_state: Mapping[str, torch.Tensor],
    training: LocalTraining,
    server_round: int,
    labels: np.ndarray | None = None,
    linear_terms: Sequence[torch.Tensor] | None = None,
    schedule: LearnerSchedule | None = None,
    learner: Callable[[torch.nn.Module, torch.Generator], Learner] | None = None,
    epoch_rows: Callable[[int, torch.nn.Module], torch.Tensor] | None = None,
    adjust_gradients: Callable[[torch.nn.Module], Callable[[], Callable[[], None] | None]] | None = None,
) -> tuple[torch.nn.Module, TrainStats]:
    """Train from ``global_state`` with ``training`` on ``labels`` (default: the node's own labels;
    FedCorr passes the corrected ones). ``linear_terms``: FedDyn's correction, one tensor per model
    parameter; ``schedule``: the learner's values for the round; ``epoch_rows``: see ``train_local``.
    A method's own ``learner`` (from the model about to train and the training's random stream) and
    ``adjust_gradients`` (from the model) replace the defaults."""
    model = node.model_for_state(global_state.keys())
    model.load_state_dict(global_state)
    anchor = [p.detach().clone() for p in model.parameters()] if training.prox_weight > 0 else None
    generator = node.generator(server_round)
    stats = train_local(model, node.data.images, node.data.labels if labels is None else labels,
                        node.train_transform, training, generator=generator,
                        device=node.device, global_params=anchor, linear_terms=linear_terms, schedule=schedule,
                        learner=None if learner is None else learner(model, generator), epoch_rows=epoch_rows,
                        adjust_gradients=None if adjust_gradients is None else adjust_gradients(model))
    return model, stats


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state as CPU tensors, ready to be sent."""
    return {key: value.detach().cpu() for key, value in model.state_dict().items()}
