"""Settings every round-based strategy shares (FedAvg and its family, standalone or as FedCorr's stage 3).

``conf/strategy/rounds/default.yaml`` holds the defaults of the schedule, ``conf/strategy/local/sgd.yaml``
those of local training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.errors import ConfigError
from common.validation import Integer, Number, check_fields, rule
from strategies.sampling import round_size
from task.local_training import LocalTraining


@dataclass(frozen=True)
class RoundSettings:
    """A round-based schedule and the local training its clients do.

    num_rounds: rounds to run (a ``comm_budget`` replaces it, see ``rounds_under``).
    fraction: share of all clients sampled per round, in (0, 1].
    min_clients: the smallest round size.
    train: the local SGD settings.
    """

    train: LocalTraining
    num_rounds: int = field(metadata=rule(Integer(low=0)))
    fraction: float = field(metadata=rule(Number(low=0.0, high=1.0, low_open=True)))
    min_clients: int = field(default=1, metadata=rule(Integer(low=1)))

    def __post_init__(self) -> None:
        check_fields(self)

    def round_size(self, num_clients: int) -> int:
        """Clients per round in a federation of ``num_clients``."""
        return round_size(self.fraction, num_clients, self.min_clients)

    def rounds_under(self, comm_budget: int | None, num_clients: int, spent: int = 0, what: str = "") -> int:
        """``num_rounds``, or with a budget the rounds that spend what ``spent`` participations leave."""
        if comm_budget is None:
            return self.num_rounds
        if comm_budget < spent:
            raise ConfigError(f"comm_budget={comm_budget} is invalid: too small; {what} alone spend {spent} "
                              "client participations")
        return (comm_budget - spent) // self.round_size(num_clients)

    def check_for(self, num_clients: int, comm_budget: int | None, key: str) -> None:
        """Checks that need the federation's size: round size and the budget's rounds."""
        if self.min_clients > num_clients:
            raise ConfigError(f"{key}.min_clients={self.min_clients} is invalid: allowed is at most "
                              f"num_clients={num_clients}")
        if comm_budget is not None and self.rounds_under(comm_budget, num_clients) < 1:
            raise ConfigError(f"comm_budget={comm_budget} is invalid: too small; one round spends "
                              f"{self.round_size(num_clients)} client participations")
