"""FedProx (Li et al. 2020): FedAvg whose clients add (mu/2) ||w - w_global||^2 to their local loss.

No client module: the proximal term is part of every client's local training (``prox_weight``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from common.validation import Number, check_fields, rule
from protocol.messages import TrainIns
from strategies.fedavg import FedAvg
from strategies.registry import RoundMethod, round_entry


@dataclass(frozen=True)
class FedProxOptions:
    """mu: the proximal coefficient mu_prox (FedCorr Appendix B uses 1; ``conf/strategy/method/fedprox.yaml``)."""

    mu: float = field(metadata=rule(Number(low=0.0)))

    def __post_init__(self) -> None:
        check_fields(self)


class FedProx(FedAvg):
    """FedAvg with a fixed proximal term on every client: Li et al.'s h_k(w) = F_k(w) + mu/2 ||w - w^t||^2,
    sent as ``prox_weight`` = mu/2 with the squared norm.

    mu: the proximal coefficient. Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, mu: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.mu = mu

    def train_instruction(self, server_round: int) -> TrainIns:
        """FedAvg's instruction with the proximal term: ``prox_weight`` = mu/2 on the squared norm."""
        ins = super().train_instruction(server_round)
        return replace(ins, training=ins.training.but(prox_weight=self.mu / 2, prox_norm="squared"))


STRATEGY = round_entry("fedprox", RoundMethod(FedProxOptions, FedProx))
