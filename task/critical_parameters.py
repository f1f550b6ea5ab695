"""FedES's parameter set P: the parameters it ranks by criticality |update * weight|.

One rule for both sides, so the client's SeGD mask (``task.selective_gradient``) and the server's
CoP (``strategies.fedes_quality``) rank the same entries. Torch-free, so the protocol can name the
choices. Only trainable parameters are candidates (never BatchNorm's running statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

# weights: every parameter tensor with 2+ dims (conv kernels, linear matrices), the released code's
# set; biases and BatchNorm scales keep their plain gradient. all: every parameter.
PARAMETER_SETS = ("weights", "all")


def in_parameter_set(shape: Sequence[int], which: str) -> bool:
    """Whether a parameter of ``shape`` belongs to P under ``which`` (one of ``PARAMETER_SETS``)."""
    if which not in PARAMETER_SETS:
        raise ValueError(f"parameter set {which!r} is unknown: allowed are {', '.join(PARAMETER_SETS)}")
    return which == "all" or len(shape) >= 2
