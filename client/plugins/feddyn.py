"""FedDyn's client side (Acar et al. 2021, Algorithm 1): its local objective and the per-client
correction kept as state.

Client k minimises L_k(w) - <g_k, w> + alpha/2 ||w - w_global||^2, where g_k is the gradient of its
loss at its previous local optimum. After training, first-order optimality gives the new
g_k = g_k - alpha (w_k - w_global), kept as client state for the client's next participation (a
client that never trained has g_k = 0), on the node's disk too when it has a ``state-dir``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import cast

import torch
from flwr.app import Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, Trained
from client.state_store import load_parameter_arrays, save_parameter_arrays
from client.update import local_update
from protocol.feddyn import PLUGIN, FedDynIns
from protocol.messages import SERVER, TrainIns, read_arrays
from task.hooks import TrainingHooks, beside_parameters
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining

STATE_KEY = "feddyn-correction"


def updated_correction(correction: Mapping[str, torch.Tensor], local: Mapping[str, torch.Tensor],
                       global_state: Mapping[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """g_k - alpha * (w_k - w_global), per parameter of ``correction``."""
    return {name: g - alpha * (local[name].detach().cpu() - global_state[name].cpu())
            for name, g in correction.items()}


class LinearTerm(TrainingHooks):
    """Plain training plus FedDyn's linear term -<g_k, w>, g_k one tensor per model parameter."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, correction: list[torch.Tensor]) -> None:
        super().__init__(training, schedule)
        self.correction = correction
        self._linear: list[torch.Tensor] = []

    def on_train_start(self, model: torch.nn.Module) -> None:
        """Keep device copies of g_k beside the parameters they pair with."""
        super().on_train_start(model)
        self._linear = beside_parameters(self.correction, model, "FedDyn's correction")

    def extra_losses(self, params: Sequence[torch.nn.Parameter]) -> Iterator[torch.Tensor]:
        """The proximal term, then -<g_k, w>."""
        yield from super().extra_losses(params)
        yield -cast(torch.Tensor, sum(torch.sum(g * p) for g, p in zip(self._linear, params)))


class FedDynPlugin(ClientPlugin):
    """Local training on FedDyn's objective, with g_k kept as node state."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Local SGD on L_k(w) - <g_k, w> + alpha/2 ||w - w_global||^2, then the new g_k kept as state."""
        alpha = self.instruction(content, FedDynIns).alpha
        # FedDyn's quadratic term is alpha/2 ||w - w_global||^2: the squared proximal term.
        training = ins.training.but(prox_weight=alpha / 2, prox_norm="squared")
        global_state = read_arrays(content, SERVER).to_torch_state_dict()
        parameters = {name: global_state[name] for name in node.parameter_names}
        correction = load_parameter_arrays(context, STATE_KEY, node.partition_id, parameters)
        model, stats = local_update(node, global_state, LinearTerm(training, ins.schedule, list(correction.values())),
                                    ins.server_round, labels=current_labels(context, node))
        save_parameter_arrays(context, STATE_KEY, node.partition_id,
                              updated_correction(correction, dict(model.named_parameters()), global_state, alpha))
        return Trained(model, stats)
