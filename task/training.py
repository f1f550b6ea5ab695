"""Local SGD on one client's data: optional mixup and an optional proximal pull toward the global model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import ConfigError, InvalidValue
from data.sources.base import ImageArray
from data.transforms import BatchTransform
from task.batches import ImageBatches, check_labels_fit, label_tensor
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


@dataclass(frozen=True)
class _Mix:
    """One batch's mixup: each sample weighted ``lam``, its partner ``sample[partner]`` 1 - lam."""

    lam: float
    partner: torch.Tensor

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.lerp(x[self.partner], x, self.lam)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Cross-entropy against the mixed one-hot targets, without building them.
        return self.lam * F.cross_entropy(out, y) + (1 - self.lam) * F.cross_entropy(out, y[self.partner])


class _Mixup:
    """Draws a lambda ~ Beta(alpha, alpha) and a partner permutation per batch, all from ``generator``."""

    def __init__(self, alpha: float, generator: torch.Generator, device: torch.device) -> None:
        self.alpha = alpha
        self.generator = generator
        self.device = device
        # torch has no Beta sampler that takes a generator; a NumPy stream seeded from it keeps one source.
        seed = torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device)
        self._rng = np.random.default_rng(int(seed))

    def draw(self, batch: int) -> _Mix:
        lam = float(self._rng.beta(self.alpha, self.alpha))
        partner = torch.randperm(batch, generator=self.generator, device=self.generator.device)
        return _Mix(lam, partner.to(self.device))


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
) -> TrainStats:
    """SGD for ``cfg.epochs`` epochs over the local set, reshuffled each epoch; trains ``model`` in place.

    images: uint8 (n, C, H, W); labels: the n labels to train on. ``transform`` turns each uint8
    batch into the network input; every random choice (order, augmentation, mixup) comes from
    ``generator``. The model is moved to ``device`` and left in the train/eval mode it came in.
    The last partial batch is kept, except a batch of one image when the model has BatchNorm layers,
    which cannot normalise a single sample in train mode: that batch is skipped.
    global_params: the global model's tensors in ``model.parameters()`` order (BatchNorm buffers are
    not parameters); needed when ``cfg.prox_weight > 0``, ignored otherwise.
    linear_terms: FedDyn's correction g (one tensor per parameter, same order); the objective then
    also subtracts the linear term <g, w> (Acar et al. 2021, Algorithm 1).

    Returns the run's ``TrainStats``: n, the last epoch's mean batch loss, the steps taken.
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
    top_label = int(targets.max())
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
    mixup = _Mixup(cfg.mixup_alpha, generator, device) if cfg.mixup_alpha > 0 else None
    squared = cfg.prox_norm == "squared"
    optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    was_training = model.training
    model.train()
    steps = 0
    try:
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator, device=generator.device).to(device)
            # Summed on the device: one host sync per call, not one per step.
            loss_sum = torch.zeros((), device=device)
            epoch_steps = 0
            for rows in order.split(cfg.batch_size):
                if has_batchnorm and rows.numel() == 1:
                    continue
                x = transform(batches(rows), generator)
                y = targets[rows]
                mix = None if mixup is None else mixup.draw(rows.numel())
                out = model(x if mix is None else mix.inputs(x))
                if steps == 0:
                    # Checked before the first loss: an out-of-range label is a device assert on CUDA.
                    check_labels_fit(top_label, out.shape[1])
                loss = F.cross_entropy(out, y) if mix is None else mix.loss(out, y)
                objective = loss
                if anchor is not None:
                    objective = objective + cfg.prox_weight * _proximal(params, anchor, squared)
                if linear is not None:
                    objective = objective - sum(torch.sum(g * p) for g, p in zip(linear, params))
                optimizer.zero_grad()
                objective.backward()
                optimizer.step()
                loss_sum += loss.detach()
                epoch_steps += 1
                steps += 1
    finally:
        model.train(was_training)
    train_loss = float(loss_sum) / epoch_steps if epoch_steps else math.nan
    return TrainStats(num_examples=n, train_loss=train_loss, steps=steps)
