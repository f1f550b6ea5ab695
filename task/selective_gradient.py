"""FedES's selective gradient descent (SeGD): the client's stage-2 step rule (``docs/fedes.md``).

At every local step, after the backward pass: the criticality of each entry i of the parameter set P
(``task.critical_parameters``) is c_i = |G_i * W_i|, ranked over all of P at once (not per layer);
with k = max(1, floor(rho * m)) and h the k-th largest c_i, the entries with c_i >= h keep their
gradient scaled by rho and the others get none: G_i <- rho * 1[c_i >= h] * G_i. Parameters outside
P keep their plain gradient. The mask is recomputed every step (the dynamic mask), or fixed for
the run from a criticality the client measured once (the static mask: its own update's CoP in the
estimation round, ``update_criticality``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from task.critical_parameters import in_parameter_set


def critical_mask(criticality: torch.Tensor, rho: float) -> torch.Tensor:
    """Boolean mask of the entries of 1-D ``criticality`` that reach its k-th largest value,
    k = max(1, floor(rho * m)) for m entries; ties with the k-th largest are all kept."""
    m = criticality.numel()
    k = max(1, math.floor(rho * m))
    # kthvalue counts from the smallest: the k-th largest is the (m - k + 1)-th smallest.
    threshold = torch.kthvalue(criticality, m - k + 1).values
    return criticality >= threshold


def parameter_set_of(model: nn.Module, mask_params: str) -> list[tuple[str, nn.Parameter]]:
    """P: the model's trainable parameters that ``mask_params`` selects, in ``parameters()`` order."""
    return [(name, param) for name, param in model.named_parameters()
            if param.requires_grad and in_parameter_set(tuple(param.shape), mask_params)]


def update_criticality(model: nn.Module, start: Mapping[str, torch.Tensor], mask_params: str) -> torch.Tensor:
    """The CoP of a local update, |(W_after - W_start) * W_start| over P, flattened in P's order (the
    server's ``strategies.fedes_quality.criticality`` of the same update)."""
    with torch.no_grad():
        return torch.cat([((param.detach().cpu() - start[name].cpu()) * start[name].cpu()).abs().flatten()
                          for name, param in parameter_set_of(model, mask_params)])


def _restore(params: Sequence[nn.Parameter], frozen: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A function that puts the ``frozen`` entries of ``params`` back to their values now: called
    right after the optimiser's step, it keeps momentum and weight decay from moving them."""
    saved = [param.detach()[mask].clone() for param, mask in zip(params, frozen)]

    def restore() -> None:
        with torch.no_grad():
            for param, mask, values in zip(params, frozen, saved):
                param[mask] = values

    return restore


def selective_gradient(model: nn.Module, *, rho: float, mask_params: str = "weights", strict_freeze: bool = False,
                       fixed_criticality: torch.Tensor | None = None) -> Callable[[], Callable[[], None] | None]:
    """SeGD's gradient adjustment for ``model``, to call after every backward pass and before the
    optimiser step (``train_local``'s ``adjust_gradients``).

    rho: the client's quality in [0, 1]: the share of P updated and the factor of their gradient.
    mask_params: which parameters form P (``task.critical_parameters.PARAMETER_SETS``).
    strict_freeze: False (released code) masks the gradient only, so momentum and weight decay still
        move masked weights; True also keeps masked weights of P unchanged through the step (the
        adjustment then returns the function that restores them after the step).
    fixed_criticality: the static mask's criticality over P (``update_criticality``'s layout): the
        mask is its top entries, the same at every step; None ranks |grad * weight| at every step.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho={rho} is invalid: allowed is a number in [0, 1]")
    in_p = [param for _, param in parameter_set_of(model, mask_params)]
    fixed: dict[int, torch.Tensor] = {}
    if fixed_criticality is not None:
        size = sum(param.numel() for param in in_p)
        if fixed_criticality.shape != (size,):
            raise ValueError(f"a static mask's criticality of shape {tuple(fixed_criticality.shape)} is invalid: "
                             f"allowed is one value per entry of P, ({size},)")
        keep = critical_mask(fixed_criticality, rho).split([param.numel() for param in in_p])
        fixed = {id(param): mask.view_as(param).to(param.device) for mask, param in zip(keep, in_p)}

    def adjust() -> Callable[[], None] | None:
        present = [param for param in in_p if param.grad is not None]
        if not present or rho == 1.0:
            return None  # rho = 1 keeps every entry at full scale: plain SGD
        grads = [param.grad for param in present if param.grad is not None]
        with torch.no_grad():
            if fixed:
                masks = [fixed[id(param)] for param in present]
            else:
                criticality = torch.cat([(grad * param).abs().flatten() for grad, param in zip(grads, present)])
                keep = critical_mask(criticality, rho).split([param.numel() for param in present])
                masks = [mask.view_as(param) for mask, param in zip(keep, present)]
            for grad, mask in zip(grads, masks):
                grad.mul_(mask.to(grad.dtype) * rho)
        return _restore(present, [~mask for mask in masks]) if strict_freeze else None

    return adjust
