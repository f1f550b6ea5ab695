"""FedES's train options: ``train`` with method ``fedes`` runs selective gradient descent (SeGD).

The server derives each client's quality rho from the weights it already receives and sends it
with every stage-2 instruction; the reply is the usual weights and ``TrainRes``, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.validation import Choice, Flag, Number, check_fields, rule
from task.critical_parameters import PARAMETER_SETS

METHOD = "fedes"
# Where SeGD's mask comes from (D4): ranked anew at every step by |grad * weight| (``dynamic``), or
# fixed for the run: the top entries of the client's own CoP from the estimation round (``static``).
MASK_SOURCES = ("dynamic", "static")


@dataclass(frozen=True)
class SeGdOptions:
    """SeGD's options for one client.

    rho: the client's estimated quality in [0, 1]; every local step updates the top
        max(1, floor(rho * m)) entries of P by |grad * weight| (dynamic mask, methods.md 4.6 D4),
        with the gradient scaled by rho.
    mask_params: the parameter set P (``task.critical_parameters``): ``weights`` (tensors of 2+ dims,
        the server's CoP uses the same rule) | ``all``.
    strict_freeze: False masks the gradient before the optimiser step, so momentum and weight decay
        still move masked weights (released code); True keeps masked weights where they were (D7).
    mask: ``dynamic`` | ``static`` (``MASK_SOURCES``, D4).
    keep_cop: after training, keep this round's CoP |(W_after - W_start) * W_start| over P as client
        state for the static mask (sent in estimation rounds; the CoP never leaves the client).
    """

    rho: float = field(metadata=rule(Number(low=0.0, high=1.0)))
    mask_params: str = field(default="weights", metadata=rule(Choice(PARAMETER_SETS)))
    strict_freeze: bool = field(default=False, metadata=rule(Flag()))
    mask: str = field(default="dynamic", metadata=rule(Choice(MASK_SOURCES)))
    keep_cop: bool = field(default=False, metadata=rule(Flag()))

    def __post_init__(self) -> None:
        check_fields(self)
