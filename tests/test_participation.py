"""Dynamic participation: who joins late and when, the strategies that sample around the late joiners,
and FedCorr's stage plan and reading of them under the paper's rule and its switches."""

from __future__ import annotations

import pytest
from defaults import context, strategy_settings
from flwr.app import ConfigRecord
from inprocess import run
from test_eval_cadence import SMOKE, bound
from test_fedcorr_strategy import ARRAYS, Correcting, stage1_answer

from common.errors import ConfigError
from protocol.fedcorr import CorrectRes
from strategies.fedavg import FedAvg
from strategies.fedcorr import FedCorr
from strategies.participation import Participation
from strategies.poc import PowerOfChoice

# One local epoch: the runs below test who trains, is read and is split when, not how well they learn.
LATE = ["experiment=smoke", "participation.late=0.3", "strategy.train.epochs=1"]


def late_fedcorr(join_round: int, *overrides: str, num_clients: int = 10) -> FedCorr:
    """Smoke FedCorr (T1 = 3) with 3 of 10 clients joining at ``join_round``."""
    participation = Participation.drawn(num_clients, 0.3, join_round, seed=1)
    strategy = FedCorr(strategy_settings("fedcorr", *SMOKE, *overrides),
                       context(num_clients=num_clients, participation=participation))
    bound(strategy, num_clients)
    return strategy


def test_the_late_joiners_are_an_exact_share_drawn_from_the_seed():
    drawn = Participation.drawn(100, 0.3, 50, seed=1)
    assert len(drawn.late) == 30 and drawn.late <= set(range(100))
    assert drawn == Participation.drawn(100, 0.3, 50, seed=1)
    assert drawn.late != Participation.drawn(100, 0.3, 50, seed=2).late
    # 0.7 * 10 is 7.000000000000001 as floats; the share is taken as written.
    assert len(Participation.drawn(10, 0.7, 5, seed=1).late) == 7
    assert Participation.drawn(100, 0.0, 50, seed=1) == Participation()


def test_a_late_joiner_takes_part_from_its_round_on():
    participation = Participation(frozenset({1, 3}), join_round=4)
    assert participation.present([0, 1, 2, 3], 3) == [0, 2]
    assert participation.present([0, 1, 2, 3], 4) == [0, 1, 2, 3]
    assert not participation.joins_by(3) and participation.joins_by(4)


def test_fedavg_samples_only_clients_that_take_part():
    participation = Participation(frozenset(range(5)), join_round=6)
    strategy = bound(FedAvg(strategy_settings("fedavg", *SMOKE, num_rounds=10),
                            context(num_clients=10, participation=participation)))
    early = {pid for server_round in range(1, 6) for pid in strategy.select(server_round, None, None)}
    late = {pid for server_round in range(6, 30) for pid in strategy.select(server_round, None, None)}
    assert early == set(range(5, 10))
    assert late == set(range(10))


def test_fedavg_trains_everyone_present_when_fewer_take_part_than_a_round_holds():
    participation = Participation(frozenset(range(8)), join_round=3)
    strategy = bound(FedAvg(strategy_settings("fedavg", *SMOKE, num_rounds=10, fraction=0.5),
                            context(num_clients=10, participation=participation)))
    assert strategy.select(1, None, None) == [8, 9]
    assert len(strategy.select(3, None, None)) == 5


def test_poc_draws_its_pool_from_the_clients_taking_part():
    participation = Participation(frozenset(range(6)), join_round=3)
    strategy = bound(PowerOfChoice(strategy_settings("poc", *SMOKE, num_rounds=5),
                                   context(num_clients=10, participation=participation)))
    assert strategy.settings.d > 4
    assert strategy.candidates(2) == [6, 7, 8, 9], "fewer take part than the pool holds: all of them"
    assert len(strategy.candidates(3)) == strategy.settings.d


@pytest.mark.parametrize("join_round, sizes", [
    (2, [7, 10, 10]),       # iteration 2 starts at round 8: they join there
    (8, [7, 10, 10]),
    (9, [7, 7, 10]),        # iteration 3 starts at round 15
    (22, [7, 7, 7]),        # after stage 1 (round 22 is stage 2's first)
])
def test_fedcorr_lets_joiners_in_at_an_iterations_start(join_round, sizes):
    strategy = late_fedcorr(join_round)
    assert strategy.settings.stage1_sizes(10, strategy.context.participation) == sizes
    ends = strategy.stage1_ends()
    assert ends == [sum(sizes[:i + 1]) for i in range(3)]
    assert strategy.stage_ends() == [ends[-1], ends[-1] + 5]
    assert strategy.planned_rounds() == ends[-1] + 5 + 5


def test_the_joiners_own_iteration_comes_after_stage_1_with_preprocess():
    strategy = late_fedcorr(22, "strategy.joiners=preprocess")
    assert strategy.settings.stage1_sizes(10, strategy.context.participation) == [7, 7, 7, 3]
    assert strategy.stage1_ends() == [7, 14, 21, 24]
    # Joiners that came in during stage 1 need no iteration of their own.
    assert late_fedcorr(2, "strategy.joiners=preprocess").stage1_ends() == [7, 17, 27]


def test_at_equal_cost_fewer_stage_1_participations_leave_stage_3_more_rounds():
    settings = strategy_settings("fedcorr", *SMOKE)
    everyone = context(num_clients=10, comm_budget=90)
    late = context(num_clients=10, comm_budget=90, participation=Participation.drawn(10, 0.3, 22, seed=1))
    assert settings.stages12_participations(10) == 30 + 15
    assert settings.stages12_participations(10, late.participation) == 21 + 15
    assert settings.stage3_rounds(late) == settings.stage3_rounds(everyone) + 3


def test_fedcorr_refuses_joiners_after_stage_2_has_started():
    settings = strategy_settings("fedcorr", *SMOKE)
    FedCorr.check_run(settings, context(num_clients=10, participation=Participation.drawn(10, 0.3, 22, seed=1)))
    with pytest.raises(ConfigError, match=r"^participation.join_round=23 is invalid: at most 22 "):
        FedCorr.check_run(settings, context(num_clients=10, participation=Participation.drawn(10, 0.3, 23, seed=1)))


def test_fedcorr_refuses_late_joiners_in_a_run_that_takes_over_another_runs_stages_1_2(tmp_path):
    settings = strategy_settings("fedcorr", *SMOKE, stages12_from=str(tmp_path))
    with pytest.raises(ConfigError, match=r"^participation.late=0.3 is invalid: 0 with strategy.stages12_from "):
        FedCorr.check_run(settings, context(num_clients=10, participation=Participation.drawn(10, 0.3, 22, seed=1)))
    FedCorr.check_run(settings, context(num_clients=10))


def test_the_mean_score_splits_as_the_cumulative_one_without_late_joiners():
    strategy = late_fedcorr(2)
    strategy.visits = dict.fromkeys(range(10), 2)
    strategy.cumulative = {pid: float(pid % 4) for pid in range(10)}
    strategy.iteration = 3
    cumulative = strategy._split_clients(strategy._client_scores())
    strategy.settings = strategy_settings("fedcorr", *SMOKE, "strategy.client_score=mean")
    assert strategy._split_clients(strategy._client_scores()) == cumulative


def test_the_mean_score_reads_a_joiner_by_its_iterations_not_its_sum():
    strategy = late_fedcorr(2, "strategy.client_score=mean")
    late = strategy.context.participation.late
    strategy.visits = {pid: 1 if pid in late else 2 for pid in range(10)}
    # Noisy clients score 2 per iteration, clean ones 1: one noisy early client and one noisy joiner.
    noisy_early, noisy_joiner = min(set(range(10)) - late), min(late)
    noisy = {noisy_early, noisy_joiner}
    strategy.cumulative = {pid: (2.0 if pid in noisy else 1.0) * strategy.visits[pid] for pid in range(10)}
    strategy.iteration = 3
    assert set(strategy._split_clients(strategy._client_scores())) == noisy
    strategy.settings = strategy_settings("fedcorr", *SMOKE)
    # The running sum puts the noisy joiner level with the clean early clients.
    assert strategy._split_clients(strategy._client_scores()) == [noisy_early]


def test_fedcorr_counts_the_iterations_each_client_trained_in_and_reads_joiners_by_their_mean(flower_identity):
    strategy = late_fedcorr(2, "strategy.client_score=mean")  # joiners from iteration 2 of 3
    late = strategy.context.participation.late
    noisy = {min(set(range(10)) - late), min(late)}
    trained = run_stage1(strategy, {pid: 2.0 if pid in noisy else 1.0 for pid in range(10)}, Asked())
    assert not late & set(trained[:7]) and sorted(trained[7:17]) == list(range(10))
    assert strategy.visits == {pid: 2 if pid in late else 3 for pid in range(10)}
    assert strategy.monitor is not None and strategy.monitor.detected == sorted(noisy)


def run_stage1(strategy: FedCorr, value: dict[int, float], grid: Correcting) -> list[int]:
    """Every stage-1 round of ``strategy`` (one client a round), each client replying with score
    ``value[pid]`` (its LID, or with ``client_score=loss_share`` a quarter of it as its share and LID 1),
    then the round that closes stage 1; returns the clients in the order they trained."""
    ends, trained = strategy.stage1_ends(), []
    shares = strategy.settings.client_score == "loss_share"
    for server_round in range(1, ends[-1] + 1):
        (sent,) = strategy.configure_train(server_round, ARRAYS, ConfigRecord(), grid)
        pid = strategy.federation.partition_of(sent.metadata.dst_node_id)
        trained.append(pid)
        lid, share = (1.0, value[pid] / 4) if shares else (value[pid], None)
        strategy.aggregate_train(server_round, [stage1_answer(sent, ARRAYS, lid, share)])
    strategy.configure_train(ends[-1] + 1, ARRAYS, ConfigRecord(), grid)
    return trained


class Asked(Correcting):
    """Clients answering ``query.correct`` with mu_hat 0.3, noting whom each correction asked."""

    def __init__(self) -> None:
        super().__init__(CorrectRes(n_relabeled=0, mu_hat=0.3))
        self.asked: list[list[int]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.asked.append(sorted(int(m.metadata.dst_node_id) - 100 for m in messages))
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.parametrize("score", ["iteration", "loss_share"])
def test_the_joiners_own_iteration_splits_them_with_the_others_latest_scores(flower_identity, score):
    """Early clients score 2 (noisy) or 1 (clean); the joiners 1.0 or 1.1, but one of them 2. Read with
    the others' latest scores, only that one joins the noisy; read alone, the 1.1s would split off."""
    strategy = late_fedcorr(22, "strategy.joiners=preprocess", f"strategy.client_score={score}")
    late = sorted(strategy.context.participation.late)
    noisy = {min(set(range(10)) - set(late)), late[0]}
    value = {pid: 2.0 if pid in noisy else (1.1 if pid in late[1:2] else 1.0) for pid in range(10)}
    assert strategy.stage1_ends() == [7, 14, 21, 24]
    grid = Asked()
    run_stage1(strategy, value, grid)
    assert grid.asked[-1] == [late[0]], "the pass corrects the flagged joiner alone"
    assert strategy.monitor is not None and strategy.monitor.detected == sorted(noisy)
    assert strategy.mu_hat[late[0]] == 0.3 and strategy.mu_hat[late[1]] == 0.0


@pytest.mark.parametrize("score", ["iteration", "loss_share"])
def test_clean_joiners_read_alone_would_split_but_read_with_the_others_are_clean(flower_identity, score):
    """Six clean joiners of 20 score 1.0 or 1.3, the early clients 2 (noisy) or 1: beside the others the
    joiners are all clean, though a split of their six scores alone would flag the 1.3s."""
    strategy = late_fedcorr(47, "strategy.joiners=preprocess", f"strategy.client_score={score}", num_clients=20)
    late = sorted(strategy.context.participation.late)
    early_noisy = sorted(set(range(20)) - set(late))[:5]
    value = {pid: 2.0 if pid in early_noisy else (1.3 if pid in late[:3] else 1.0) for pid in range(20)}
    assert len(late) == 6 and strategy.stage1_ends() == [14, 28, 42, 48]
    run_stage1(strategy, value, Asked())
    assert strategy.monitor is not None and strategy.monitor.detected == early_noisy


def test_a_loss_share_of_exactly_0_or_1_is_a_share(flower_identity):
    strategy = late_fedcorr(22, "strategy.client_score=loss_share")
    for server_round, share in ((1, 0.0), (2, 1.0)):
        (sent,) = strategy.configure_train(server_round, ARRAYS, ConfigRecord(), None)
        strategy.aggregate_train(server_round, [stage1_answer(sent, ARRAYS, 1.0, share)])
    assert sorted(strategy._shares.values()) == [0.0, 1.0]


def _joiner_run(join_round: int, *overrides: str) -> tuple[dict, frozenset[int]]:
    payload = run([*LATE, f"participation.join_round={join_round}", *overrides])
    return payload, Participation.drawn(10, 0.3, join_round, seed=1).late


def test_under_the_papers_rule_joiners_after_stage_1_are_finetuned_on_unread():
    payload, late = _joiner_run(22)
    stage1 = [row for row in payload["rounds"] if row["stage"] == "preprocess"]
    assert len(stage1) == 21 and not late & {pid for row in stage1 for pid in row["clients"]}
    block = payload["fedcorr"]
    assert all(set(map(int, it["lid"])) == set(range(10)) - late for it in block["iterations"])
    assert late <= set(block["finetune_clients"])
    joiners = block["late_joiners"]
    assert (joiners["clients"], joiners["flagged"]) == (3, 0)
    assert joiners["missed"] == joiners["noisy"]
    trained_later = {pid for row in payload["rounds"] if row["stage"] != "preprocess" for pid in row["clients"]}
    assert late & trained_later


def test_with_preprocess_the_joiners_train_once_and_are_split_with_everyone():
    payload, late = _joiner_run(22, "strategy.joiners=preprocess", "strategy.client_score=mean")
    stage1 = [row for row in payload["rounds"] if row["stage"] == "preprocess"]
    assert len(stage1) == 24
    assert {pid for row in stage1[21:] for pid in row["clients"]} == late
    # Each joiner trains from stage 1's last global model, which the iteration leaves as it is;
    # iteration 3's rounds move it.
    accuracies = [row["test_acc"] for row in stage1[20:]]
    assert accuracies[1:] == [accuracies[0]] * 3
    assert len({row["test_acc"] for row in stage1[14:21]}) > 1
    iterations = payload["fedcorr"]["iterations"]
    assert len(iterations) == 4 and set(map(int, iterations[3]["lid"])) == late
    # The others keep the third iteration's reading and estimates; the joiners get the new split's.
    before, after = set(iterations[2]["detected_noisy_clients"]), set(iterations[3]["detected_noisy_clients"])
    assert after - late == before
    assert all(iterations[3]["mu_hat"][str(k)] == iterations[2]["mu_hat"][str(k)] for k in set(range(10)) - late)
    assert all(iterations[3]["mu_hat"][str(k)] == 0.0 for k in late - after)
    assert payload["fedcorr"]["late_joiners"]["flagged"] == len(after & late)
