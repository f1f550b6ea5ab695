"""FedNoRo's client side: logit-adjusted training (with distillation on noisy clients) and the
per-class losses the server detects noisy clients from (``query.class_loss``).

No client state: the role and lambda_t come with every message, the class frequencies are counted
again from the labels each round. What leaves the client beyond weights: at each detection (once by
default), one C-vector of per-class mean losses and one of per-class counts
(``protocol.fednoro.ClassLosses``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins import ClientMethod, Trained
from client.update import local_update
from protocol.fednoro import ABSENT_FLOOR, ClassLosses, ClassLossQuery, FedNoRoOptions
from protocol.fednoro import METHOD as NAME
from protocol.messages import SERVER, TrainIns, read_arrays, read_instruction, reply
from task.evaluation import augmented_logits, per_sample_losses, predict_logits
from task.learners.logit_adjusted import LogitAdjustedDistillation, class_log_prior


def frozen_model(node: LocalNode, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """The model of ``state`` in evaluation mode, without gradients: the distillation's teacher."""
    model = node.model_for_state(state.keys())
    model.load_state_dict(state)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def fednoro_train(node: LocalNode, context: Context, arrays: ArrayRecord, ins: TrainIns,
                  options: FedNoRoOptions) -> Trained:
    """Local SGD on the logit-adjusted loss; a noisy client also distils the global model it received."""
    state = arrays.to_torch_state_dict()
    labels = current_labels(context, node)
    floor = ABSENT_FLOOR if options.absent_classes == "floor" else None
    log_prior = class_log_prior(labels, node.dataset.num_classes, floor)
    teacher = frozen_model(node, state) if options.noisy and options.kd_weight > 0 else None

    def learner(model: torch.nn.Module, generator: torch.Generator) -> LogitAdjustedDistillation:
        return LogitAdjustedDistillation(log_prior, options.la_tau, teacher, options.kd_weight, options.temperature)

    model, stats = local_update(node, state, ins.training, ins.server_round, labels=labels,
                                schedule=ins.schedule, learner=learner)
    return Trained(model, stats)


def per_class_losses(losses: np.ndarray, labels: np.ndarray, num_classes: int) -> ClassLosses:
    """Per class of ``labels``: its count and the mean of its samples' ``losses`` (0.0 if it has none)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.bincount(labels, minlength=num_classes)
    sums = np.bincount(labels, weights=np.asarray(losses, dtype=np.float64), minlength=num_classes)
    means = np.divide(sums, counts, out=np.zeros(num_classes), where=counts > 0)
    return ClassLosses(counts=tuple(int(c) for c in counts), losses=tuple(float(m) for m in means))


def class_loss(node: LocalNode, context: Context, content: RecordDict) -> RecordDict:
    """The sent model's per-class mean cross-entropy on this client's given labels, on the evaluation
    transform or one seeded draw of the training augmentation (``ClassLossQuery.transform``)."""
    query = read_instruction(content, ClassLossQuery)
    model = node.new_model()
    model.load_state_dict(read_arrays(content, SERVER).to_torch_state_dict())
    labels = current_labels(context, node)
    if query.transform == "train":
        logits = augmented_logits(model, node.data.images, node.train_transform,
                                  node.generator(query.server_round, "fednoro-detection"), device=node.device)
    else:
        logits = predict_logits(model, node.data.images, node.eval_transform, device=node.device)
    return reply(per_class_losses(per_sample_losses(logits, labels), labels, node.dataset.num_classes))


METHOD = ClientMethod(NAME, options=FedNoRoOptions, train=fednoro_train, queries={"class_loss": class_loss})
