"""The cadence of the server's central evaluation: which rounds get evaluated under ``server.eval_every``
and FedCorr's ``strategy.stage1_eval``, that each stage's last round and the run's last round always
are, and that skipping evaluations changes nothing else in a run."""

from __future__ import annotations

import pytest
from defaults import composed, context, strategy_settings

from server.run import EvaluationSchedule
from settings.run import run_settings
from strategies.fedavg import FedAvg
from strategies.fedcorr import FedCorr
from strategies.federation import Federation

SMOKE = ("experiment=smoke",)  # 10 clients; FedCorr's preset: t1=3, t2=5, t3=5 (rounds 1-30, 31-35, 36-40)


def bound(strategy: FedAvg | FedCorr, num_clients: int = 10) -> FedAvg | FedCorr:
    """``strategy`` bound to a federation of ``num_clients`` nodes of 50 samples each."""
    clients = range(num_clients)
    strategy.bind(Federation(node_of={k: k + 100 for k in clients}, num_examples=dict.fromkeys(clients, 50)))
    return strategy


def fedcorr(*overrides: str) -> FedCorr:
    """FedCorr with the smoke preset's stages and ``overrides``, bound to 10 clients."""
    strategy = FedCorr(strategy_settings("fedcorr", *SMOKE, *overrides), context(num_clients=10))
    bound(strategy)
    return strategy


def evaluated(strategy: FedAvg | FedCorr, eval_every: int = 1) -> list[int]:
    """The rounds the server's observer would evaluate for ``strategy``."""
    settings = run_settings(composed(*SMOKE, f"server.eval_every={eval_every}"))
    schedule = EvaluationSchedule.of(settings, strategy)
    return [r for r in range(1, strategy.planned_rounds() + 1) if schedule.due(r)]


def test_the_default_evaluates_every_round_as_the_paper_does():
    strategy = fedcorr()
    assert strategy.settings.stage1_eval == "round", "conf/strategy/fedcorr.yaml's default"
    assert evaluated(strategy) == list(range(1, 41))


def test_iteration_evaluates_stage_1_at_each_iterations_end_and_every_later_round():
    strategy = fedcorr("strategy.stage1_eval=iteration")
    assert strategy.planned_rounds() == 40 and strategy.stage_ends() == [30, 35]
    assert evaluated(strategy) == [10, 20, 30, *range(31, 41)]


@pytest.mark.parametrize("cadence", ["round", "iteration"])
def test_stage_ends_and_the_last_round_are_evaluated_whatever_eval_every_says(cadence):
    strategy = fedcorr(f"strategy.stage1_eval={cadence}")
    rounds = evaluated(strategy, eval_every=7)
    assert {30, 35, 40} <= set(rounds), "each stage's end and the run's last round"
    stage1 = [7, 14, 21, 28] if cadence == "round" else []  # an iteration's end (10, 20) is no 7th round
    assert rounds == [*stage1, 30, 35, 40]


def test_iterations_of_several_rounds_skip_all_but_their_last():
    # Without fraction scheduling stage 1 visits frac2 N = 3 clients per round: 4 rounds per iteration.
    strategy = fedcorr("strategy.ablation.fraction_scheduling=false", "strategy.stage1_eval=iteration")
    assert strategy.stage_ends()[0] == 12
    assert evaluated(strategy)[:4] == [4, 8, 12, 13]


def test_a_strategy_without_a_cadence_of_its_own_follows_eval_every():
    strategy = bound(FedAvg(strategy_settings("fedavg", *SMOKE, num_rounds=10), context(num_clients=10)))
    assert evaluated(strategy) == list(range(1, 11))
    assert evaluated(strategy, eval_every=3) == [3, 6, 9, 10]


def test_an_unknown_cadence_is_refused():
    from common.errors import InvalidValue

    with pytest.raises(InvalidValue, match=r"^strategy.stage1_eval='never' is invalid: allowed are round, iteration$"):
        strategy_settings("fedcorr", "strategy.stage1_eval=never")


FEDCORR_RUN = "experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=2 strategy.t2=2 strategy.t3=2"


def test_skipped_evaluations_leave_results_json_and_every_evaluated_round_as_they_were(run_inprocess, tmp_path):
    every, _ = run_inprocess(f"{FEDCORR_RUN} strategy.stage1_eval=round out_dir={tmp_path / 'every'}")
    sparse, _ = run_inprocess(f"{FEDCORR_RUN} strategy.stage1_eval=iteration out_dir={tmp_path / 'sparse'}")
    due = {10, 20, 21, 22, 23, 24}  # iteration ends (stage 1 ends at 20), then stages 2 and 3
    assert [row["round"] for row in sparse["rounds"] if row["test_acc"] is not None] == sorted(due)
    assert all(row["test_loss"] is None for row in sparse["rounds"] if row["round"] not in due)
    for full, row in zip(every["rounds"], sparse["rounds"], strict=True):
        kept = {key: value for key, value in full.items() if key != "elapsed_s"}
        if full["round"] not in due:
            kept.update(test_acc=None, test_loss=None)
        assert {key: value for key, value in row.items() if key != "elapsed_s"} == kept
    assert sparse["summary"]["final_acc"] == every["summary"]["final_acc"]
    assert sparse["fedcorr"] == every["fedcorr"], "detection and correction do not depend on the cadence"
    assert sparse["test_confusion"] == every["test_confusion"]
