"""Local SGD on one client's data, shaped by a method's training hooks (``task.hooks``): the objective
of a local learner (``task/learners/``), the rows of each epoch, extra loss terms and what happens
around each step."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from common.errors import ConfigError, InvalidValue
from data.sources.base import ImageArray
from data.transforms import BatchTransform
from task.batches import ImageBatches, check_labels_fit, label_tensor
from task.hooks import TrainingHooks
from task.learners import Batch
from task.local_training import LocalTraining, TrainStats

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


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
    hooks: TrainingHooks,
    *,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
) -> TrainStats:
    """SGD for ``hooks.training.epochs`` epochs over the local set, reshuffled each epoch; trains
    ``model`` in place.

    images: uint8 (n, C, H, W); labels: the n labels to train on. ``transform`` turns each uint8
    batch into the network input; ``hooks`` give the training's settings, its objective, the rows of
    each epoch and extra loss terms, and run after every backward pass and step (``task.hooks``).
    Every random choice (order, augmentation, the learner's draws) comes from ``generator``. The
    model is moved to ``device`` and left in the train/eval mode it came in.
    The last partial batch is kept, except a batch of one image when the model has BatchNorm layers,
    which cannot normalise a single sample in train mode: that batch is skipped.

    Returns the run's ``TrainStats``: n, the last epoch's mean batch loss as the learner reports it
    (without extra terms), the steps taken.
    """
    cfg = hooks.training
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
    hooks.on_train_start(model)
    learner = hooks.learner(model, generator)
    # A throwaway generator: the check must not move the training's random stream.
    probe = transform(batches(torch.zeros(1, dtype=torch.long)), torch.Generator(generator.device).manual_seed(0))
    check_labels_fit(int(targets.max()), _output_width(model, probe))
    optimizer: torch.optim.Optimizer = (
        torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay) if cfg.optimizer == "adam"
        else torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay))

    was_training = model.training
    model.train()
    steps = 0
    try:
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=generator, device=generator.device).to(device)
            rows_now = hooks.epoch_rows(epoch, model)
            if rows_now is not None:
                rows_now = torch.as_tensor(rows_now, dtype=torch.long).to(device)
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
                for term in hooks.extra_losses(params):
                    objective = objective + term
                optimizer.zero_grad()
                objective.backward()
                hooks.after_backward(model)
                optimizer.step()
                hooks.after_step(model)
                loss_sum += loss.reported.detach()
                epoch_steps += 1
                steps += 1
    finally:
        model.train(was_training)
    train_loss = float(loss_sum) / epoch_steps if epoch_steps else math.nan
    return TrainStats(num_examples=n, train_loss=train_loss, steps=steps)
