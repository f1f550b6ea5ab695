"""FedProx (Li et al. 2020): FedAvg whose clients add (mu/2) ||w - w_global||^2 to their local loss."""

from __future__ import annotations

from flwr.app import ConfigRecord

from strategies.fedavg import FedAvg


class FedProx(FedAvg):
    """FedAvg with a fixed proximal term on every client.

    mu: the proximal coefficient mu_prox (FedCorr Appendix B uses 1); clients get
        prox_weight = mu/2 with the squared norm, Li et al.'s h_k(w) = F_k(w) + mu/2 ||w - w^t||^2.
    Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, mu: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.mu = mu

    def train_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        record = super().train_config(server_round, config)
        record["prox_weight"] = self.mu / 2
        record["prox_norm"] = "squared"
        return record
