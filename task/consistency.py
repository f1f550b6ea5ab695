"""FedDiv's predictive-consistency sampler (Li et al., AAAI 2024, eqs. 10-12): keep a sample only
when the global model's prediction agrees with the local model's de-biased prediction.

A client's local model leans toward its own frequent classes; subtracting xi log p_hat (p_hat: a
moving average of the local model's mean prediction) from its logits removes that lean before the
two predictions are compared.
"""

from __future__ import annotations

import numpy as np
import torch


def debiased_labels(logits: torch.Tensor, prior: np.ndarray, xi: float) -> np.ndarray:
    """argmax(f(x) - xi log p_hat) per row."""
    shift = xi * torch.log(torch.as_tensor(prior, dtype=logits.dtype).clamp(min=torch.finfo(logits.dtype).tiny))
    return (logits - shift).argmax(dim=1).numpy()


def consistent(candidates: np.ndarray, global_labels: np.ndarray, local_labels: np.ndarray) -> np.ndarray:
    """The candidate rows whose global prediction equals the local de-biased one."""
    candidates = np.asarray(candidates, dtype=np.int64)
    return candidates[global_labels[candidates] == local_labels[candidates]]


def updated_prior(prior: np.ndarray, logits: torch.Tensor, momentum: float, xi: float,
                  confidence: float | None = None) -> np.ndarray:
    """p_hat <- m p_hat + (1 - m) mean softmax(f(x)) over the local set (eq. 12). With ``confidence``
    only rows whose de-biased max-probability exceeds it are averaged (the released code; none
    qualifies: p_hat is kept)."""
    probabilities = torch.softmax(logits, dim=1)
    if confidence is not None:
        shift = xi * torch.log(torch.as_tensor(prior, dtype=logits.dtype).clamp(min=torch.finfo(logits.dtype).tiny))
        confident = torch.softmax(logits - shift, dim=1).max(dim=1).values > confidence
        if not bool(confident.any()):
            return np.asarray(prior, dtype=np.float64)
        probabilities = probabilities[confident]
    mean = probabilities.double().mean(dim=0).numpy()
    return momentum * np.asarray(prior, dtype=np.float64) + (1 - momentum) * mean
