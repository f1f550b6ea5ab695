"""FedProx (Li et al. 2020): FedAvg whose clients add (mu/2) ||w - w_global||^2 to their local loss.

No client plug-in: the proximal term is part of every client's local training (``prox_weight``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.validation import Interval, option
from protocol.messages import TrainIns
from strategies.fedavg import FedAvg
from strategies.rounds import RoundSettings


@dataclass(frozen=True)
class FedProxSettings(RoundSettings):
    """FedAvg's schedule and the proximal coefficient (``conf/strategy/options/fedprox.yaml``)."""

    mu: float = option(Interval(float, 0.0), "the proximal coefficient mu_prox (FedCorr Appendix B: 1)")


class FedProx(FedAvg):
    """FedAvg with a fixed proximal term on every client: Li et al.'s h_k(w) = F_k(w) + mu/2 ||w - w^t||^2,
    sent as ``prox_weight`` = mu/2 with the squared norm."""

    name = "fedprox"
    settings: FedProxSettings

    def train_instruction(self, server_round: int) -> TrainIns:
        """FedAvg's instruction with the proximal term: ``prox_weight`` = mu/2 on the squared norm."""
        ins = super().train_instruction(server_round)
        return replace(ins, training=ins.training.but(prox_weight=self.settings.mu / 2, prox_norm="squared"))
