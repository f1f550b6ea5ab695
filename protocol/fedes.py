"""FedES's train instruction: ``train`` with plug-in ``fedes`` runs selective gradient descent (SeGD).

The server derives each client's quality rho from the weights it already receives and sends it
with every stage-2 instruction; the reply is the usual weights and ``TrainStats``, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.validation import Checked, Flag, Interval, Options, option
from task.critical_parameters import PARAMETER_SETS

PLUGIN = "fedes"
# Where SeGD's mask comes from: ranked anew at every step by |grad * weight| (``dynamic``), or
# fixed for the run: the top entries of the client's own CoP from the estimation round (``static``).
MASK_SOURCES = ("dynamic", "static")


@dataclass(frozen=True)
class SeGdIns(Checked):
    """SeGD's instruction for one client.

    rho: the client's estimated quality in [0, 1]; every local step updates the top
        max(1, floor(rho * m)) entries of P by |grad * weight| (the dynamic mask), with the gradient
        scaled by rho.
    mask_params: the parameter set P (``task.critical_parameters``): ``weights`` (tensors of 2+ dims,
        the server's CoP uses the same rule) | ``all``.
    strict_freeze: False masks the gradient before the optimiser step, so momentum and weight decay
        still move masked weights (released code); True keeps masked weights where they were.
    mask: ``dynamic`` | ``static`` (``MASK_SOURCES``).
    keep_cop: after training, keep this round's CoP |(W_after - W_start) * W_start| over P as client
        state for the static mask (sent in estimation rounds; the CoP never leaves the client).
    """

    rho: float = option(Interval(float, 0.0, 1.0))
    mask_params: str = option(Options(PARAMETER_SETS))
    strict_freeze: bool = option(Flag())
    mask: str = option(Options(MASK_SOURCES))
    keep_cop: bool = option(Flag(), default=False)
