"""Evaluation of a model on a set of images: logits, class probabilities, per-sample and mean loss."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import ConfigError
from common.validation import Interval
from data.sources.base import ImageArray
from data.transforms import BatchTransform
from models.peer_pair import PeerPair
from task.batches import ImageBatches, check_labels_fit, label_tensor
from task.scores import Scores


def predict_logits(
    model: nn.Module,
    images: ImageArray,
    transform: BatchTransform,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Model outputs (n, M) as a float32 CPU tensor, in eval mode and without gradients.

    ``transform`` must be an evaluation transform (built with train=False), so the result is
    deterministic. The model is moved to ``device`` and left in the mode it came in.
    """
    if not isinstance(transform, BatchTransform) or transform.train:
        raise ConfigError(
            f"transform {transform!r} is invalid for evaluation: "
            "allowed is a BatchTransform built with train=False"
        )
    return _forward(model, images, transform, None, batch_size, device)


def augmented_logits(
    model: nn.Module,
    images: ImageArray,
    transform: BatchTransform,
    generator: torch.Generator,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Like ``predict_logits`` (eval mode, no gradients) but on a training transform's random
    augmentation of every image, drawn from ``generator``: the released FedDiv code scores its noise
    filter's losses this way."""
    if not isinstance(transform, BatchTransform) or not transform.train:
        raise ConfigError(
            f"transform {transform!r} is invalid for augmented scoring: "
            "allowed is a BatchTransform built with train=True"
        )
    return _forward(model, images, transform, generator, batch_size, device)


def _forward(model: nn.Module, images: ImageArray, transform: BatchTransform, generator: torch.Generator | None,
             batch_size: int, device: torch.device | str) -> torch.Tensor:
    Interval(int, 1).check("batch_size", batch_size)
    batches = ImageBatches(images, device)
    model.to(batches.device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            rows = torch.arange(len(batches), device=batches.device)
            # Kept on the device and concatenated once: one copy to the host instead of one per batch.
            outputs = [model(transform(batches(chunk), generator)) for chunk in rows.split(batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(outputs).float().cpu()


def predict_proba(
    model: nn.Module,
    images: ImageArray,
    transform: BatchTransform,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Softmax outputs, float32 of shape (n, M); each row sums to 1."""
    logits = predict_logits(model, images, transform, batch_size=batch_size, device=device)
    return torch.softmax(logits, dim=1).numpy()


def _losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    check_labels_fit(int(targets.max()), logits.shape[1])
    return F.cross_entropy(logits, targets, reduction="none")


def per_sample_losses(logits: torch.Tensor, labels: np.ndarray) -> np.ndarray:
    """The cross-entropy of each row of ``logits`` (from ``predict_logits``) against its label, checked."""
    return _losses(logits, label_tensor(labels, logits.shape[0])).numpy()


def loss_and_proba(
    model: nn.Module,
    images: ImageArray,
    labels: np.ndarray,
    transform: BatchTransform,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample cross-entropy (n,) and softmax outputs (n, M) from one pass over the images."""
    targets = label_tensor(labels, len(images))
    logits = predict_logits(model, images, transform, batch_size=batch_size, device=device)
    return _losses(logits, targets).numpy(), torch.softmax(logits, dim=1).numpy()


def evaluate(
    model: nn.Module,
    images: ImageArray,
    labels: np.ndarray,
    transform: BatchTransform,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> Scores:
    """The model's mean cross-entropy and accuracy on ``images`` with ``labels``. A ``PeerPair``
    scores as the mean of its two networks' scores (how FedLSR reports Co-teaching)."""
    if isinstance(model, PeerPair):
        each = [evaluate(member, images, labels, transform, batch_size=batch_size, device=device)
                for member in model.members]
        return Scores(loss=sum(s.loss for s in each) / 2, accuracy=sum(s.accuracy for s in each) / 2,
                      num_examples=each[0].num_examples)
    targets = label_tensor(labels, len(images))
    return _scores(predict_logits(model, images, transform, batch_size=batch_size, device=device), targets)


def evaluate_by_class(
    model: nn.Module,
    images: ImageArray,
    labels: np.ndarray,
    transform: BatchTransform,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> tuple[Scores, np.ndarray | None]:
    """``evaluate``'s scores and, from the same forward pass, the confusion matrix (M, M) of int64
    counts: row = true class, column = predicted class. None for a ``PeerPair``, whose two networks
    make no single prediction."""
    if isinstance(model, PeerPair):
        return evaluate(model, images, labels, transform, batch_size=batch_size, device=device), None
    targets = label_tensor(labels, len(images))
    logits = predict_logits(model, images, transform, batch_size=batch_size, device=device)
    scores = _scores(logits, targets)  # checks that the labels fit the classes first
    num_classes = logits.shape[1]
    cells = torch.bincount(targets * num_classes + logits.argmax(dim=1), minlength=num_classes * num_classes)
    return scores, cells.reshape(num_classes, num_classes).numpy()


def _scores(logits: torch.Tensor, targets: torch.Tensor) -> Scores:
    losses = _losses(logits, targets)
    correct = logits.argmax(dim=1) == targets
    return Scores(loss=float(losses.double().mean()), accuracy=float(correct.double().mean()),
                  num_examples=int(logits.shape[0]))
