"""SCAFFOLD's client side (Karimireddy et al., ICML 2020, Algorithm 1, option II).

The client trains from the global model x with every gradient corrected by c - c_i (c: the server's
control variate, sent as the plug-in's arrays; c_i: its own, client state, zero before its first
round), then sets c_i+ = c_i - c + (x - y) / (K eta_l) from its K local steps at learning rate eta_l
and its trained model y, keeps c_i+ (on disk too with a ``state-dir``) and sends c_i+ - c_i. The
formula assumes plain SGD steps; with momentum the displacement x - y is larger than K eta_l times
the mean corrected gradient (docs/scaffold.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, Trained
from client.state_store import load_parameter_arrays, save_parameter_arrays
from client.update import local_update
from protocol.messages import SERVER, TrainIns, read_arrays, read_plugin_arrays
from protocol.scaffold import PLUGIN
from task.hooks import TrainingHooks, beside_parameters
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining

STATE_KEY = "scaffold-control"


class ControlVariates(TrainingHooks):
    """Plain training whose every gradient gets ``correction`` (c - c_i, one tensor per parameter)
    added after the backward pass."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, correction: list[torch.Tensor]) -> None:
        super().__init__(training, schedule)
        self.correction = correction
        self._on_device: list[torch.Tensor] = []

    def on_train_start(self, model: torch.nn.Module) -> None:
        """Keep the correction beside the parameters it applies to."""
        super().on_train_start(model)
        self._on_device = beside_parameters(self.correction, model, "SCAFFOLD's control variates")

    def after_backward(self, model: torch.nn.Module) -> None:
        """Add c - c_i to every gradient."""
        with torch.no_grad():
            for param, correction in zip(model.parameters(), self._on_device):
                if param.grad is not None:
                    param.grad.add_(correction)


def updated_control(own: Mapping[str, torch.Tensor], control: Mapping[str, torch.Tensor],
                    start: Mapping[str, torch.Tensor], trained: Mapping[str, torch.Tensor], steps: int,
                    lr: float) -> dict[str, torch.Tensor]:
    """Option II: c_i+ = c_i - c + (x - y) / (K eta_l); a client that took no step keeps c_i."""
    if steps == 0:
        return dict(own)
    return {name: own[name] - control[name] + (start[name] - trained[name]) / (steps * lr) for name in own}


class ScaffoldPlugin(ClientPlugin):
    """Corrected local steps, and the client's control variate kept as state."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Train with the correction c - c_i, then keep c_i+ and send c_i+ - c_i."""
        start = read_arrays(content, SERVER).to_torch_state_dict()
        control = read_plugin_arrays(content, PLUGIN, SERVER).to_torch_state_dict()
        names = node.parameter_names
        own = load_parameter_arrays(context, STATE_KEY, node.partition_id, {name: start[name] for name in names})
        hooks = ControlVariates(ins.training, ins.schedule, [control[name] - own[name] for name in names])
        model, stats = local_update(node, start, hooks, ins.server_round, labels=current_labels(context, node))
        trained = {name: param.detach().cpu() for name, param in model.named_parameters()}
        new = updated_control(own, control, start, trained, stats.steps, ins.training.lr)
        save_parameter_arrays(context, STATE_KEY, node.partition_id, new)
        change = {name: new[name] - own[name] for name in names}
        return Trained(model, stats, arrays=ArrayRecord({name: value.contiguous() for name, value in change.items()}))
