"""The settings every round-based strategy shares (FedAvg and its family, standalone or as FedCorr's
stage 3): a schedule of rounds and the local training its clients do.

``conf/strategy/rounds/default.yaml`` holds the defaults of the schedule, ``conf/strategy/local/sgd.yaml``
those of local training.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError, InvalidValue
from common.validation import Interval, option
from strategies.base import StrategySettings
from strategies.context import StrategyContext
from strategies.sampling import round_size
from task.local_training import LocalTraining


def rounds_left(comm_budget: int, spent: int, per_round: int, what: str) -> int:
    """The rounds of ``per_round`` participations that ``comm_budget`` pays for once ``what`` has
    spent ``spent``; a budget below ``spent`` is refused."""
    if comm_budget < spent:
        raise ConfigError(f"comm_budget={comm_budget} is invalid: too small; {what} alone spend {spent} "
                          "client participations")
    return (comm_budget - spent) // per_round


@dataclass(frozen=True)
class RoundSettings(StrategySettings):
    """A round-based schedule and the local training its clients do."""

    train: LocalTraining = option(meaning="the local training settings of every round")
    num_rounds: int = option(Interval(int, 1), "rounds to run (a comm_budget replaces it)")
    fraction: float = option(Interval(float, 0.0, 1.0, closed="right"), "share of all clients sampled per round")
    min_clients: int = option(Interval(int, 1), "the smallest round size")

    def round_size(self, num_clients: int) -> int:
        """Clients per round in a federation of ``num_clients``."""
        return round_size(self.fraction, num_clients, self.min_clients)

    def rounds_under(self, comm_budget: int | None, num_clients: int, spent: int = 0, what: str = "") -> int:
        """``num_rounds``, or with a budget the rounds that spend what ``spent`` participations leave."""
        if comm_budget is None:
            return self.num_rounds
        return rounds_left(comm_budget, spent, self.round_size(num_clients), what)

    def check_run(self, context: StrategyContext) -> None:
        """As a standalone strategy: a round size that fits the federation, a budget that pays for a
        round, and the method's own options (``check_options``)."""
        self.check_round_size(context)
        if context.comm_budget is not None and self.rounds_under(context.comm_budget, context.num_clients) < 1:
            raise ConfigError(f"comm_budget={context.comm_budget} is invalid: too small; one round spends "
                              f"{self.round_size(context.num_clients)} client participations")
        self.check_options(context)

    def check_round_size(self, context: StrategyContext) -> None:
        """``min_clients`` must fit the federation."""
        if self.min_clients > context.num_clients:
            raise InvalidValue("min_clients", self.min_clients,
                               f"allowed is at most num_clients={context.num_clients}")

    def check_options(self, context: StrategyContext) -> None:
        """Checks of the method's own options that need the run, standalone or as FedCorr's stage 3
        (none by default)."""
