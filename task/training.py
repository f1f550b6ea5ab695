"""Local SGD on one client's data with a local learner's objective (``task/learners/``), an optional
proximal pull toward the global model and FedDyn's optional linear term."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from common.errors import ConfigError, InvalidValue
from data.sources.base import ImageArray
from data.transforms import BatchTransform
from task.batches import ImageBatches, check_labels_fit, label_tensor
from task.learner_options import LearnerSchedule
from task.learners import Batch, Learner, make_learner
from task.local_training import LocalTraining, TrainStats

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _param_copies(
    name: str, params: Sequence[nn.Parameter], tensors: Sequence[torch.Tensor], device: torch.device
) -> list[torch.Tensor]:
    """Private device copies of ``tensors``, one per model parameter, checked against their shapes."""
    tensors = list(tensors)
    if len(tensors) != len(params):
        raise ConfigError(
            f"{name} has {len(tensors)} tensors but the model has {len(params)} parameters; "
            "allowed is one tensor per model.parameters(), in the same order"
        )
    copies = []
    for i, (param, ref) in enumerate(zip(params, tensors)):
        ref = torch.as_tensor(ref)
        if ref.shape != param.shape:
            raise ConfigError(
                f"{name}[{i}] has shape {tuple(ref.shape)}; "
                f"allowed is the shape of model parameter {i}, {tuple(param.shape)}"
            )
        # A copy, so it can never alias (and move with) the parameters being trained.
        copies.append(ref.detach().to(device=device, dtype=param.dtype, copy=True))
    return copies


def _proximal(params: Sequence[nn.Parameter], anchor: Sequence[torch.Tensor], squared: bool) -> torch.Tensor:
    # vector_norm's gradient at 0 is 0 (a subgradient), so the first step, where w == w_global,
    # stays finite; a sqrt of a sum of squares would give NaN there.
    per_tensor = torch.stack([torch.linalg.vector_norm(p - g) for p, g in zip(params, anchor)])
    distance = torch.linalg.vector_norm(per_tensor)
    return distance.square() if squared else distance


def _output_width(model: nn.Module, x: torch.Tensor) -> int:
    """The number of outputs of ``model`` on input ``x``, from one evaluation-mode pass without
    gradients (no state changes): labels are checked against it before the first loss, because an
    out-of-range label is a device assert on CUDA."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return int(model(x).shape[1])
    finally:
        model.train(was_training)


def train_local(
    model: nn.Module,
    images: ImageArray,
    labels: np.ndarray,
    transform: BatchTransform,
    cfg: LocalTraining,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    global_params: Sequence[torch.Tensor] | None = None,
    linear_terms: Sequence[torch.Tensor] | None = None,
    schedule: LearnerSchedule | None = None,
    learner: Learner | None = None,
    epoch_rows: Callable[[int, nn.Module], torch.Tensor] | None = None,
    adjust_gradients: Callable[[], Callable[[], None] | None] | None = None,
) -> TrainStats:
    """SGD for ``cfg.epochs`` epochs over the local set, reshuffled each epoch; trains ``model`` in place.

    images: uint8 (n, C, H, W); labels: the n labels to train on. ``transform`` turns each uint8
    batch into the network input; the loss is ``cfg.learner``'s; every random choice (order,
    augmentation, the learner's draws) comes from ``generator``. The model is moved to ``device`` and
    left in the train/eval mode it came in.
    The last partial batch is kept, except a batch of one image when the model has BatchNorm layers,
    which cannot normalise a single sample in train mode: that batch is skipped.
    global_params: the global model's tensors in ``model.parameters()`` order (BatchNorm buffers are
    not parameters); needed when ``cfg.prox_weight > 0``, ignored otherwise.
    linear_terms: FedDyn's correction g (one tensor per parameter, same order); the objective then
    also subtracts the linear term <g, w> (Acar et al. 2021, Algorithm 1).
    schedule: the learner's values for this round from the server (default: none scheduled).
    learner: a method's own objective (FedNoRo's distillation, FedDiv's mixup with its regulariser),
    in place of ``cfg.learner``'s.
    epoch_rows: ``(epoch, model) -> rows``: the local rows the epoch trains on (FedDiv re-selects its
    samples with the current model before every epoch); the epoch shuffles them. Default: all rows.
    adjust_gradients: called after every backward pass, before the step (FedES masks and scales the
    gradients there); what it returns, if not None, is called right after the step.

    Returns the run's ``TrainStats``: n, the last epoch's mean batch loss as the learner reports it
    (without regularisers), the steps taken.
    """
    if not isinstance(cfg, LocalTraining):
        raise ConfigError(f"cfg of type {type(cfg).__name__} is invalid: allowed is a LocalTraining")
    if not isinstance(transform, BatchTransform):
        raise ConfigError(f"transform {transform!r} is invalid: allowed is a BatchTransform")
    if not isinstance(generator, torch.Generator):
        raise ConfigError(f"generator {generator!r} is invalid: allowed is a torch.Generator")
    device = torch.device(device)
    batches = ImageBatches(images, device)
    n = len(batches)
    targets = label_tensor(labels, n).to(device)
    has_batchnorm = any(isinstance(m, _BATCHNORMS) for m in model.modules())
    if has_batchnorm and cfg.batch_size == 1:
        raise InvalidValue("batch_size", 1, "a model with BatchNorm needs batches of 2 or more")
    model.to(device)
    params = list(model.parameters())
    anchor = None
    if cfg.prox_weight > 0:
        if global_params is None:
            raise ConfigError("prox_weight > 0 needs global_params: the global model's parameters")
        anchor = _param_copies("global_params", params, global_params, device)
    linear = None if linear_terms is None else _param_copies("linear_terms", params, linear_terms, device)
    if learner is None:
        learner = make_learner(cfg, schedule or LearnerSchedule(), generator)
    # A throwaway generator: the check must not move the training's random stream.
    probe = transform(batches(torch.zeros(1, dtype=torch.long)), torch.Generator(generator.device).manual_seed(0))
    check_labels_fit(int(targets.max()), _output_width(model, probe))
    squared = cfg.prox_norm == "squared"
    optimizer: torch.optim.Optimizer = (
        torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay) if cfg.optimizer == "adam"
        else torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay))

    was_training = model.training
    model.train()
    steps = 0
    try:
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=generator, device=generator.device).to(device)
            if epoch_rows is not None:
                rows_now = torch.as_tensor(epoch_rows(epoch, model), dtype=torch.long).to(device)
                chosen = torch.zeros(n, dtype=torch.bool, device=device)
                chosen[rows_now] = True
                order = order[chosen[order]]
            # Summed on the device: one host sync per call, not one per step.
            loss_sum = torch.zeros((), device=device)
            epoch_steps = 0
            for rows in order.split(cfg.batch_size):
                if has_batchnorm and rows.numel() == 1:
                    continue
                loss = learner(model, Batch(batches(rows), targets[rows], transform, generator))
                objective = loss.objective
                if anchor is not None:
                    objective = objective + cfg.prox_weight * _proximal(params, anchor, squared)
                if linear is not None:
                    objective = objective - sum(torch.sum(g * p) for g, p in zip(linear, params))
                optimizer.zero_grad()
                objective.backward()
                after_step = adjust_gradients() if adjust_gradients is not None else None
                optimizer.step()
                if after_step is not None:
                    after_step()
                loss_sum += loss.reported.detach()
                epoch_steps += 1
                steps += 1
    finally:
        model.train(was_training)
    train_loss = float(loss_sum) / epoch_steps if epoch_steps else math.nan
    return TrainStats(num_examples=n, train_loss=train_loss, steps=steps)
