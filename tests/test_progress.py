"""The progress line's ETA: each round left weighed by the clients it will train, at the seconds per
client update measured in its stage, plus the evaluations still due; and the round sizes the
strategies plan."""

from __future__ import annotations

import io

import pytest
from defaults import context, strategy_settings
from test_eval_cadence import SMOKE, bound, fedcorr

from server.progress import Progress
from server.run import EvaluationSchedule
from strategies.fedavg import FedAvg


def row(server_round: int, elapsed_s: float, clients: int) -> dict:
    return {"round": server_round, "stage": "s", "test_acc": None, "test_loss": None,
            "clients": list(range(clients)), "comm_cost": 0, "elapsed_s": elapsed_s}


def two_stages() -> Progress:
    """Rounds 1-4 of one client each, then rounds 5-10 of ten; stage ends and the last round are evaluated."""
    schedule = EvaluationSchedule(every=100, last=10, stage_ends=frozenset({4}))
    return Progress(schedule, lambda r: 1 if r <= 4 else 10, stream=io.StringIO())


def test_no_eta_before_a_round_was_measured():
    progress = two_stages()
    first = row(1, 5.0, 1)  # 5 s, Ray's start included: not a round's cost
    progress.update(first, None)
    assert progress.eta(first) is None
    assert progress.stream.getvalue().rstrip().endswith("elapsed 0:00:05  ETA -")


def test_a_stage_not_started_is_costed_by_its_planned_clients_and_a_started_one_by_its_own_rate():
    progress = two_stages()
    for r, elapsed in ((1, 5.0), (2, 6.0), (3, 7.0)):  # stage 1: 1 s per one-client round
        progress.measure(row(r, elapsed, 1), None)
    # Round 4 (1 update at 1 s), then six rounds of 10 updates at the 1 s measured so far; no
    # evaluation was timed yet. The mean of the rounds so far would say 7/3 s a round, 16 s.
    assert progress.eta(row(3, 7.0, 1)) == pytest.approx(1 + 60)
    progress.measure(row(4, 10.0, 1), 2.0)  # 3 s, 2 of them evaluating: still 1 s per update
    assert progress.eta(row(4, 10.0, 1)) == pytest.approx(60 + 2)  # round 10 is evaluated: + 2 s
    progress.measure(row(5, 15.0, 10), None)  # stage 2's own rate: 0.5 s per update
    assert progress.eta(row(5, 15.0, 10)) == pytest.approx(5 * 10 * 0.5 + 2)


def test_the_line_shows_round_stage_accuracy_clients_and_eta():
    schedule = EvaluationSchedule(every=1, last=10)
    progress = Progress(schedule, lambda r: 3, stream=io.StringIO())
    progress.update(row(1, 4.0, 3), 1.0)
    progress.update({**row(2, 20.0, 3), "stage": "fedavg", "test_acc": 0.8125, "test_loss": 0.61, "comm_cost": 6},
                    1.0)
    line = progress.stream.getvalue().splitlines()[-1]
    assert "[round    2/10] fedavg" in line and "0.8125" in line
    # The count of the round's clients, named apart from rounds.csv's "clients" column (their ids).
    assert "n_clients   3" in line and " clients " not in line
    # 16 s for round 2, 1 of it evaluating: 5 s per update, 8 rounds of 3 updates and 8 evaluations of 1 s.
    assert "elapsed 0:00:20" in line and "ETA 0:02:08" in line


def test_fedavg_plans_its_round_size_in_every_round():
    strategy = bound(FedAvg(strategy_settings("fedavg", *SMOKE, num_rounds=10), context(num_clients=10)))
    assert [strategy.planned_clients(r) for r in (1, 10)] == [strategy.round_size()] * 2 == [3, 3]


def test_fedcorr_plans_one_client_a_round_in_stage_1_then_frac2_at_most_the_clean_ones():
    strategy = fedcorr()  # stage 1: rounds 1-30, stage 2: 31-35, stage 3: 36-40; frac2 N = 3
    assert [strategy.planned_clients(r) for r in (1, 30, 31, 35, 36, 40)] == [1, 1, 3, 3, 3, 3]
    strategy.clean = [4, 7]  # stage 1 found two clean clients: stage 2 trains them only
    assert [strategy.planned_clients(r) for r in (31, 35, 36)] == [2, 2, 3]
    strategy.clean = list(range(8))
    assert strategy.planned_clients(31) == 3
