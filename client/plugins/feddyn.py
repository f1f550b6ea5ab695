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

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, Trained
from client.state_store import load_record, save_record
from client.update import local_update
from protocol.feddyn import PLUGIN, FedDynIns
from protocol.messages import SERVER, TrainIns, read_arrays
from task.hooks import TrainingHooks
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining

STATE_KEY = "feddyn-correction"


def load_correction(context: Context, partition_id: int, parameters: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """g_k, one tensor per entry of ``parameters`` (the model's parameters by name, in order; only
    their shapes and dtypes are used); zeros before the client's first FedDyn round."""
    names = list(parameters)
    record = load_record(context, STATE_KEY, partition_id)
    if record is None:
        return [torch.zeros_like(param) for param in parameters.values()]
    if sorted(record) != sorted(names):
        raise RuntimeError(
            f"client state holds a FedDyn correction for parameters {sorted(record)} but the model has "
            f"{sorted(names)}; the model changed during the run"
        )
    return [torch.from_numpy(np.array(record[name].numpy())) for name in names]


def updated_correction(
    correction: list[torch.Tensor],
    local: Mapping[str, torch.Tensor],
    global_state: Mapping[str, torch.Tensor],
    names: list[str],
    alpha: float,
) -> list[torch.Tensor]:
    """g_k - alpha * (w_k - w_global), per parameter (``names`` in ``correction``'s order)."""
    return [g - alpha * (local[name].detach().cpu() - global_state[name].cpu())
            for g, name in zip(correction, names)]


def store_correction(context: Context, partition_id: int, names: list[str], correction: list[torch.Tensor]) -> None:
    """Keep g_k (one tensor per parameter in ``names``) as client state, on disk too with a
    ``state-dir``, for the client's next FedDyn round."""
    record = ArrayRecord(
        {name: Array(np.ascontiguousarray(g.detach().cpu().numpy())) for name, g in zip(names, correction)}
    )
    save_record(context, STATE_KEY, partition_id, record)


class LinearTerm(TrainingHooks):
    """Plain training plus FedDyn's linear term -<g_k, w>, g_k one tensor per model parameter."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, correction: list[torch.Tensor]) -> None:
        super().__init__(training, schedule)
        self.correction = correction
        self._linear: list[torch.Tensor] = []

    def on_train_start(self, model: torch.nn.Module) -> None:
        """Keep device copies of g_k beside the parameters they pair with."""
        super().on_train_start(model)
        params = list(model.parameters())
        if [tuple(g.shape) for g in self.correction] != [tuple(p.shape) for p in params]:
            raise RuntimeError("FedDyn's correction does not match the model's parameters")
        # Copies, so they can never alias (and move with) the parameters being trained.
        self._linear = [g.detach().to(device=p.device, dtype=p.dtype, copy=True)
                        for g, p in zip(self.correction, params)]

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
        names = node.parameter_names
        correction = load_correction(context, node.partition_id, {name: global_state[name] for name in names})
        model, stats = local_update(node, global_state, LinearTerm(training, ins.schedule, correction),
                                    ins.server_round, labels=current_labels(context, node))
        local = dict(model.named_parameters())
        store_correction(context, node.partition_id, names,
                         updated_correction(correction, local, global_state, names, alpha))
        return Trained(model, stats)
