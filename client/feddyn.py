"""FedDyn's client side (Acar et al. 2021, Algorithm 1): the per-client correction and its state.

Client k minimises L_k(w) - <g_k, w> + alpha/2 ||w - w_global||^2, where g_k is the gradient of its
loss at its previous local optimum. After training, first-order optimality gives the new
g_k = g_k - alpha (w_k - w_global), kept as client state for the client's next participation (a
client that never trained has g_k = 0), on the node's disk too when it has a ``state-dir``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context

from client.state_store import load_record, save_record

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
