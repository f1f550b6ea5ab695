"""The schedule every round-based strategy shares (``strategies.rounds.RoundSettings``): the round size
with its floor, the rounds a budget pays for, and the run checks that refuse a round size or a budget
the federation cannot meet, each in one line naming the key and what is allowed."""

from __future__ import annotations

import pytest
from defaults import context, strategy_settings

from common.errors import ConfigError, InvalidValue
from strategies.rounds import RoundSettings, rounds_left


def schedule(**changes: object) -> RoundSettings:
    """FedAvg's schedule as ``conf/`` gives it, with ``changes``."""
    settings = strategy_settings("fedavg", **changes)
    assert isinstance(settings, RoundSettings)
    return settings


def test_the_round_size_is_raised_to_min_clients():
    """round(0.1 * 10) = 1 client, raised to the floor of 3; a floor below the fraction's size does nothing."""
    assert schedule(fraction=0.1, min_clients=3).round_size(10) == 3
    assert schedule(fraction=0.5, min_clients=3).round_size(10) == 5


def test_a_budget_pays_for_whole_rounds_of_the_round_size():
    """Without a budget the schedule's own rounds; with one, what is left after ``spent`` in whole rounds."""
    settings = schedule(num_rounds=7, fraction=0.1, min_clients=3)
    assert settings.rounds_under(None, 10) == 7
    assert settings.rounds_under(10, 10) == 3  # 10 // 3
    assert settings.rounds_under(10, 10, spent=4, what="the warm-up rounds") == 2  # (10 - 4) // 3
    assert rounds_left(9, 9, 3, "stages 1 and 2") == 0


def test_a_budget_below_what_is_already_spent_is_refused_naming_what_spent_it():
    with pytest.raises(ConfigError) as caught:
        schedule(fraction=0.1, min_clients=3).rounds_under(5, 10, spent=8, what="the warm-up rounds")
    assert str(caught.value) == ("comm_budget=5 is invalid: too small; the warm-up rounds alone spend 8 "
                                 "client participations")


def test_min_clients_may_equal_the_federation_but_not_exceed_it():
    """min_clients = num_clients samples everyone each round; one more is refused as an InvalidValue whose
    key is relative to the strategy block (``plan_strategy`` puts ``strategy.`` in front)."""
    schedule(min_clients=10).check_run(context(num_clients=10))
    with pytest.raises(InvalidValue) as caught:
        schedule(min_clients=11).check_run(context(num_clients=10))
    assert (caught.value.key, caught.value.value) == ("min_clients", 11)
    assert str(caught.value) == "min_clients=11 is invalid: allowed is at most num_clients=10"


def test_a_budget_of_exactly_one_round_is_accepted_and_one_participation_less_refused():
    """Rounds of round(0.3 * 10) = 3 clients: a budget of 3 pays for one round, 2 for none."""
    settings = schedule(fraction=0.3, min_clients=1)
    settings.check_run(context(num_clients=10, comm_budget=3))
    with pytest.raises(ConfigError) as caught:
        settings.check_run(context(num_clients=10, comm_budget=2))
    assert str(caught.value) == "comm_budget=2 is invalid: too small; one round spends 3 client participations"
