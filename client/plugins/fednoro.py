"""FedNoRo's client side: logit-adjusted training (with distillation on noisy clients) and the
per-class losses the server detects noisy clients from (``query.class_loss``).

No client state: the role and lambda_t come with every message, the class frequencies are counted
again from the labels each round. What leaves the client beyond weights: at each detection (once by
default), one C-vector of per-class mean losses and the C-vector mask of the classes it has, or the
per-class counts where the server asks for them (``protocol.fednoro.ClassLossRes``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, QueryHandler, Trained
from client.update import local_update
from protocol.fednoro import ABSENT_FLOOR, PLUGIN, ClassLossIns, ClassLossRes, FedNoRoIns
from protocol.messages import SERVER, TrainIns, read_arrays, read_instruction, reply
from task.evaluation import augmented_logits, per_sample_losses, predict_logits
from task.hooks import TrainingHooks
from task.learner_settings import LearnerSchedule
from task.learners import Learner
from task.learners.logit_adjusted import LogitAdjustedDistillation, class_log_prior
from task.local_training import LocalTraining


def frozen_model(node: LocalNode, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """The model of ``state`` in evaluation mode, without gradients: the distillation's teacher."""
    model = node.model_for_state(state.keys())
    model.load_state_dict(state)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


class LogitAdjusted(TrainingHooks):
    """Training on FedNoRo's objective: the logit-adjusted loss, with distillation from ``teacher``
    (None: no distillation)."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, ins: FedNoRoIns, log_prior: torch.Tensor,
                 teacher: torch.nn.Module | None) -> None:
        super().__init__(training, schedule)
        self.ins, self.log_prior, self.teacher = ins, log_prior, teacher

    def learner(self, model: torch.nn.Module, generator: torch.Generator) -> Learner:
        """The logit-adjusted distillation loss."""
        return LogitAdjustedDistillation(self.log_prior, self.ins.la_tau, self.teacher, self.ins.kd_weight,
                                         self.ins.temperature)


def per_class_losses(losses: np.ndarray, labels: np.ndarray, num_classes: int, counts: bool = False) -> ClassLossRes:
    """Per class of ``labels``: the mean of its samples' ``losses`` (0.0 if it has none), and whether
    the class is present (with ``counts``: how many samples it has)."""
    labels = np.asarray(labels, dtype=np.int64)
    sizes = np.bincount(labels, minlength=num_classes)
    sums = np.bincount(labels, weights=np.asarray(losses, dtype=np.float64), minlength=num_classes)
    means = tuple(float(m) for m in np.divide(sums, sizes, out=np.zeros(num_classes), where=sizes > 0))
    if counts:
        return ClassLossRes(losses=means, counts=tuple(int(c) for c in sizes))
    return ClassLossRes(losses=means, present=tuple(int(c > 0) for c in sizes))


def class_loss(node: LocalNode, context: Context, content: RecordDict) -> RecordDict:
    """The sent model's per-class mean cross-entropy on this client's given labels, on the evaluation
    transform or one seeded draw of the training augmentation (``ClassLossIns.transform``)."""
    query = read_instruction(content, ClassLossIns)
    model = node.new_model()
    model.load_state_dict(read_arrays(content, SERVER).to_torch_state_dict())
    labels = current_labels(context, node)
    if query.transform == "train":
        logits = augmented_logits(model, node.data.images, node.train_transform,
                                  node.generator(query.server_round, "fednoro-detection"), device=node.device)
    else:
        logits = predict_logits(model, node.data.images, node.eval_transform, device=node.device)
    return reply(per_class_losses(per_sample_losses(logits, labels), labels, node.dataset.num_classes,
                                  counts=query.counts))


class FedNoRoPlugin(ClientPlugin):
    """Logit-adjusted training (distilling on noisy clients), and ``query.class_loss``."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Local SGD on the logit-adjusted loss; a noisy client also distils the global model it received."""
        fednoro = self.instruction(content, FedNoRoIns)
        state = read_arrays(content, SERVER).to_torch_state_dict()
        labels = current_labels(context, node)
        floor = ABSENT_FLOOR if fednoro.absent_classes == "floor" else None
        log_prior = class_log_prior(labels, node.dataset.num_classes, floor)
        teacher = frozen_model(node, state) if fednoro.noisy and fednoro.kd_weight > 0 else None
        hooks = LogitAdjusted(ins.training, ins.schedule, fednoro, log_prior, teacher)
        model, stats = local_update(node, state, hooks, ins.server_round, labels=labels)
        return Trained(model, stats)

    def queries(self) -> Mapping[str, QueryHandler]:
        """``query.class_loss``: the detection's per-class losses."""
        return {"class_loss": class_loss}
