"""FedES's client side: selective gradient descent (SeGD) at the rho the server sends.

Local SGD on the node's current labels with cross-entropy, every step's gradient masked and scaled
by ``task.selective_gradient``. With the static mask the client keeps, from the estimation
round, the CoP of its own update over P (client state, on disk with a ``state-dir``; it never leaves
the client) and masks the top max(1, floor(rho m)) of it in every SeGD round. The reply is the
trained weights and the usual ``TrainRes``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, Trained
from client.state_store import load_record, save_record
from client.update import local_update
from protocol.fedes import PLUGIN, SeGdIns
from protocol.messages import SERVER, TrainIns, read_arrays
from task.hooks import TrainingHooks
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining
from task.selective_gradient import selective_gradient, update_criticality

COP_KEY = "fedes-cop"


def kept_criticality(context: Context, node: LocalNode) -> torch.Tensor:
    """The CoP this client kept from its last estimation round (the static mask's ranking)."""
    record = load_record(context, COP_KEY, node.partition_id)
    if record is None:
        raise RuntimeError(f"client {node.partition_id} has no CoP from an estimation round for FedES's static "
                           "mask; a node that restarts mid-run keeps it only with a state-dir")
    return torch.from_numpy(record["cop"].numpy())


class SelectiveGradient(TrainingHooks):
    """Plain training whose gradients SeGD masks and scales between the backward pass and the step
    (``task.selective_gradient``); with ``strict_freeze`` the masked weights are put back after it."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, ins: SeGdIns,
                 fixed: torch.Tensor | None) -> None:
        super().__init__(training, schedule)
        self.ins = ins
        self.fixed = fixed
        self._adjust: Callable[[], Callable[[], None] | None] | None = None
        self._restore: Callable[[], None] | None = None

    def on_train_start(self, model: torch.nn.Module) -> None:
        """Build SeGD's adjustment for the model's parameter set P."""
        super().on_train_start(model)
        self._adjust = selective_gradient(model, rho=self.ins.rho, mask_params=self.ins.mask_params,
                                          strict_freeze=self.ins.strict_freeze, fixed_criticality=self.fixed)

    def after_backward(self, model: torch.nn.Module) -> None:
        """Mask and scale the gradients."""
        assert self._adjust is not None
        self._restore = self._adjust()

    def after_step(self, model: torch.nn.Module) -> None:
        """Put strictly frozen weights back."""
        if self._restore is not None:
            self._restore()
            self._restore = None


class FedESPlugin(ClientPlugin):
    """Selective gradient descent at the rho the server sends."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Local SGD from the global arrays with SeGD's mask at the instruction's rho; in an
        estimation round with ``keep_cop`` the update's CoP is kept for the static mask."""
        segd = self.instruction(content, SeGdIns)
        start = read_arrays(content, SERVER).to_torch_state_dict()
        fixed = kept_criticality(context, node) if segd.mask == "static" and segd.rho < 1.0 else None
        model, stats = local_update(node, start, SelectiveGradient(ins.training, ins.schedule, segd, fixed),
                                    ins.server_round, labels=current_labels(context, node))
        if segd.keep_cop:
            cop = update_criticality(model, start, segd.mask_params).numpy()
            save_record(context, COP_KEY, node.partition_id, ArrayRecord({"cop": Array(cop)}))
        return Trained(model, stats)
