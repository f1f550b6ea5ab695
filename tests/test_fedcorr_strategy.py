"""FedCorr's strategy driven by hand through its round hooks, with chosen replies (one test runs an
in-process federation): stage 1's instructions, the running sum of LID and the split guard, the
corrections and the replies refused, the finetuning rounds and the stage ends, the checkpoint state
and what a run taking another's stages 1-2 keeps of it, the budget, the header line and the result
files."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
from defaults import context, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from test_eval_cadence import SMOKE, bound, fedcorr
from test_fedavg import answer

from common.errors import ConfigError
from common.mixture import above_lowest
from protocol.fedcorr import PLUGIN, CorrectIns, CorrectRes, LidRes, Stage1Ins
from protocol.messages import LOSS, TrainIns, TrainStats, read_arrays, read_instruction, read_plugin_ins, reply
from strategies import fedcorr as fedcorr_module
from strategies.base import ClientFailure
from strategies.fedavg import FedAvg
from strategies.fedcorr import DONE, FINETUNE, FedCorr
from task.local_training import LocalTraining
from task.scores import Scores


def learnt(strategy: FedCorr) -> FedCorr:
    """``strategy`` after stage 1 found client 3 noisy and stage 3 ran four rounds."""
    strategy.mu_hat[3] = 0.25
    strategy.clean = [0, 1, 2]
    assert strategy.stage3 is not None
    strategy.stage3.stage_rounds = 4
    return strategy


def test_a_restore_takes_stage_3s_state_and_an_inherit_leaves_it_fresh():
    saved = learnt(fedcorr("strategy.stage3=fedprox")).state()
    assert saved["stage3"]["stage_rounds"] == 4 and saved["mu_hat"][3] == 0.25
    restored = fedcorr("strategy.stage3=fedprox")
    restored.restore(saved)
    assert restored.stage3 is not None and restored.stage3.stage_rounds == 4
    assert restored.mu_hat[3] == 0.25 and restored.clean == [0, 1, 2]
    assert restored.state() == saved
    taken = fedcorr("strategy.stage3=fedprox")
    taken.inherit(saved)
    assert taken.mu_hat[3] == 0.25 and taken.clean == [0, 1, 2], "stages 1-2's findings carry over"
    assert taken.stage3 is not None and taken.stage3.stage_rounds == 0, "its own stage 3 starts fresh"


def test_without_a_stage_3_the_state_says_so_and_a_stage_3_state_is_not_restored():
    without = fedcorr("strategy.t3=0")
    assert without.stage3 is None and without.state()["stage3"] is None
    without.restore(learnt(fedcorr("strategy.stage3=fedprox")).state())
    assert without.stage3 is None and without.mu_hat[3] == 0.25


def test_stages_1_2_of_another_run_end_where_its_finetuning_does():
    settings = strategy_settings("fedcorr", *SMOKE, "strategy.t1=2", "strategy.t2=3")
    assert settings.starts_from(10) is None
    taken = strategy_settings("fedcorr", *SMOKE, "strategy.t1=2", "strategy.t2=3", "strategy.stages12_from=/runs/a")
    # frac1 = 1/N: 10 rounds per iteration, 2 iterations, then 3 finetuning rounds.
    assert taken.starts_from(10) == ("/runs/a", 23)
    assert taken.starts_from(5) == ("/runs/a", 13)


def test_without_finetuning_stages_1_2_spend_only_stage_1s_participations():
    # t1 = 3 iterations of all 10 clients; t2 = 5 rounds of frac2 N = 3 clients.
    assert strategy_settings("fedcorr", *SMOKE).stages12_participations(10) == 3 * 10 + 5 * 3
    off = strategy_settings("fedcorr", *SMOKE, "strategy.ablation.finetuning=false")
    assert off.stages12_participations(10) == 3 * 10


def test_the_run_header_logs_fedcorrs_settings(caplog):
    strategy = fedcorr()
    with caplog.at_level(logging.INFO, logger="strategies.fedcorr"):
        strategy.summary()
    assert [record.getMessage() for record in caplog.records] == [f"FedCorr: {strategy.settings}"]


class WithFiles(FedAvg):
    """A stage 3 that writes an array file of its own."""

    def result_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        return {"stage3.npz": {"kept": np.arange(3)}}


def test_the_result_files_hold_stage_3s_and_fedcorrs_own():
    strategy = fedcorr("strategy.stage3=poc")
    assert set(strategy.result_blocks()) == {"poc", "fedcorr"}
    assert strategy.result_arrays() == {}, "no confusion counts came, and PoC writes no array file"
    strategy.monitor.confusion[2] = {"before": np.arange(4)}  # type: ignore[union-attr]
    strategy.stage3 = WithFiles(strategy.settings.stage3_settings(rounds=2), context(), stage="usual")
    files = strategy.result_arrays()
    assert sorted(files) == ["confusion.npz", "stage3.npz"]
    assert files["stage3.npz"]["kept"].tolist() == [0, 1, 2] and files["confusion.npz"]["clients"].tolist() == [2]


def test_stage_3s_own_queries_wait_the_runs_round_timeout(run_inprocess, monkeypatch):
    from grid import LocalGrid

    waits: list[tuple[str, float | None]] = []
    send = LocalGrid.send_and_receive

    def timed(self, messages, *, timeout=None):
        messages = list(messages)
        waits.extend((message.metadata.message_type, timeout) for message in messages)
        return send(self, messages, timeout=timeout)

    monkeypatch.setattr(LocalGrid, "send_and_receive", timed)
    run_inprocess("experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=1 strategy.t2=1 "
                  "strategy.t3=1 strategy.stage3=poc server.round_timeout=77")
    queried = {timeout for kind, timeout in waits if kind == LOSS}
    assert queried == {77.0}, "PoC's candidates answer within the run's round timeout"


ARRAYS = ArrayRecord({"w": Array(np.zeros(2, np.float32))})


def in_stage_2(strategy: FedCorr, clean: list[int]) -> FedCorr:
    """``strategy`` at the start of its finetuning rounds, with ``clean`` as S_c."""
    strategy.stage, strategy.clean, strategy._finetune_left = FINETUNE, clean, strategy.settings.t2
    return strategy


def test_finetuning_rounds_carry_the_learners_schedule_from_stage_2s_first_round(flower_identity):
    strategy = in_stage_2(fedcorr("strategy.train.learner=lsr", "strategy.train.lsr.warmup_rounds=4"), [0, 1, 2, 3])
    gamma = strategy.settings.train.lsr.gamma
    weights = []
    for server_round in range(31, 36):  # the smoke preset's five stage-2 rounds
        (first, *_) = strategy.configure_train(server_round, ARRAYS, ConfigRecord(), None)
        weights.append(read_instruction(first.content, TrainIns).schedule.distill_weight)
    assert weights == pytest.approx([0.0, gamma / 4, gamma / 2, 3 * gamma / 4, gamma])


def stage1_answer(message: Message, arrays: ArrayRecord, lid: float | None, share: float | None = None) -> Message:
    """The addressed client's stage-1 reply: ``arrays``, and its LID score (and loss share) unless
    ``lid`` is None."""
    extra = None if lid is None else LidRes(lid=lid, loss_share=share)
    return Message(content=reply(TrainStats(num_examples=10, train_loss=0.5, steps=1), arrays=arrays, extra=extra,
                                 plugin=PLUGIN), reply_to=message)


@pytest.mark.parametrize(("arrays", "lid", "refusal"), [
    (ArrayRecord({"w": Array(np.zeros(3, np.float32))}), 4.0, r"key 'arrays' .*shape \(3,\)"),
    (ARRAYS, None, r"key 'fedcorr' is missing"),
])
def test_a_stage_1_reply_without_the_rounds_shape_or_a_lid_score_is_refused_naming_the_client(
        flower_identity, arrays, lid, refusal):
    strategy = fedcorr()
    (sent,) = strategy.configure_train(1, ARRAYS, ConfigRecord(), None)  # m1 = 1: one client a round
    pid = strategy.federation.partition_of(sent.metadata.dst_node_id)
    with pytest.raises(ClientFailure, match=rf"^client {pid} sent a bad message: {refusal}"):
        strategy.aggregate_train(1, [stage1_answer(sent, arrays, lid)])


def stage1_training(strategy: FedCorr) -> LocalTraining:
    """The local training of the first client of stage 1's first round."""
    (first, *_) = strategy.configure_train(1, ARRAYS, ConfigRecord(), None)
    return read_instruction(first.content, TrainIns).training


def test_stage_1_trains_with_fedcorrs_own_mixup_and_proximal_norm(flower_identity):
    # The train block's own mixup_alpha and prox_norm (1.0, squared) are not what stage 1 uses.
    train = stage1_training(fedcorr("strategy.mixup_alpha=2.5", "strategy.prox_norm=l2"))
    assert (train.learner, train.mixup_alpha, train.prox_norm) == ("mixup", 2.5, "l2")
    assert train.prox_weight == 0.0, "every client starts with mu_hat = 0"
    without = stage1_training(fedcorr("strategy.mixup_alpha=0"))
    assert (without.learner, without.mixup_alpha) == ("ce", 1.0), "alpha 0 turns mixup off"


def test_a_finetuning_round_averages_its_replies_and_logs_their_mean_loss(flower_identity):
    strategy = in_stage_2(fedcorr(), [0, 1, 2, 3])
    sent = list(strategy.configure_train(31, ARRAYS, ConfigRecord(), None))
    assert len(sent) == 3, "frac2 N = 3 of the 4 clean clients"
    _, metrics = strategy.aggregate_train(31, [answer(m, loss) for m, loss in zip(sent, (0.2, 0.4, 0.9), strict=True)])
    assert metrics is not None and metrics["train-loss"] == pytest.approx(0.5)
    (info,) = strategy.history
    assert (info.stage, info.train_loss, len(info.clients)) == ("finetune", pytest.approx(0.5), 3)


def test_a_round_after_the_last_is_one_clear_error():
    strategy = fedcorr("strategy.t3=0")
    strategy.stage = DONE
    with pytest.raises(RuntimeError, match=r"^FedCorr has no round 36: its 35 rounds are done$"):
        strategy.configure_train(36, ARRAYS, ConfigRecord(), None)


def stage1_iterations(strategy: FedCorr, *lids: Callable[[int], float], grid: Any = None,
                      share: Callable[[int], float] | None = None) -> None:
    """Stage-1 iterations over the smoke preset's 10 clients, one a round, each client replying in
    iteration i with LID ``lids[i](pid)`` (and loss share ``share(pid)``, if given); the round after the
    last closes its iteration (with ``grid`` answering the corrections, if any)."""
    rounds = range(1, 10 * len(lids) + 1)
    for server_round in rounds:
        (sent,) = strategy.configure_train(server_round, ARRAYS, ConfigRecord(), grid)
        pid = strategy.federation.partition_of(sent.metadata.dst_node_id)
        answer = stage1_answer(sent, ARRAYS, lids[(server_round - 1) // 10](pid), None if share is None else share(pid))
        strategy.aggregate_train(server_round, [answer])
    strategy.configure_train(rounds[-1] + 1, ARRAYS, ConfigRecord(), grid)


def test_each_iteration_adds_every_clients_lid_to_its_running_sum(flower_identity):
    strategy = fedcorr()
    stage1_iterations(strategy, lambda pid: 5.0, lambda pid: 2.0)  # all alike: nobody is flagged
    assert strategy.monitor is not None
    first, second = strategy.monitor.iterations
    assert (first["iteration"], second["iteration"]) == (1, 2)
    assert second["lid"] == {str(pid): 2.0 for pid in range(10)}
    assert second["cumulative_lid"] == {str(pid): 7.0 for pid in range(10)}
    assert second["detected_noisy_clients"] == [] and second["mu_hat"] == {str(pid): 0.0 for pid in range(10)}


@pytest.mark.parametrize(("guard", "lid", "said"), [
    # Ten evenly spread scores: the 2-component mixture does not beat one on BIC.
    ("bic", lambda pid: 20.0 + 0.1 * pid, True),
    # Identical scores carry no split whatever the guard; the paper's rule has no guard to report.
    ("none", lambda pid: 5.0, False),
])
def test_a_guard_that_finds_one_population_says_so_and_flags_nobody(flower_identity, caplog, guard, lid, said):
    strategy = fedcorr(f"strategy.client_split_guard={guard}")
    with caplog.at_level(logging.INFO, logger="strategies.fedcorr"):
        stage1_iterations(strategy, lid)
    assert strategy.monitor is not None and strategy.monitor.detected == []
    line = f"FedCorr: the {guard} guard finds one population in the clients' cumulative scores; no client is flagged"
    assert (line in caplog.messages) is said


def test_the_client_score_is_the_running_sum_or_this_iterations_lid(flower_identity):
    # Iteration 1: clients 7-9 stand apart; iteration 2: clients 2-4, as far.
    second = lambda pid: 9.0 if pid in (2, 3, 4) else 1.0  # noqa: E731
    detected = {}
    for score in ("cumulative", "iteration"):
        strategy = fedcorr(f"strategy.client_score={score}")
        stage1_iterations(strategy, flagged, second, grid=Correcting(CorrectRes(n_relabeled=0, mu_hat=0.3)))
        assert strategy.monitor is not None and strategy.cumulative[7] == 10.0, "the running sum is kept either way"
        detected[score] = [it["detected_noisy_clients"] for it in strategy.monitor.iterations]
    assert detected["cumulative"] == [[7, 8, 9], [2, 3, 4, 7, 8, 9]], "sums of 10 against 2"
    assert detected["iteration"] == [[7, 8, 9], [2, 3, 4]], "iteration 1's LID no longer counts"


def test_the_loss_share_score_asks_for_the_shares_and_splits_on_them(flower_identity):
    strategy = fedcorr("strategy.client_score=loss_share")
    (sent,) = strategy.configure_train(1, ARRAYS, ConfigRecord(), None)
    asked = read_plugin_ins(sent.content, PLUGIN, Stage1Ins, "the server")
    assert asked.loss_share and asked.seed == strategy.context.seed
    assert not read_plugin_ins(fedcorr().configure_train(1, ARRAYS, ConfigRecord(), None)[0].content, PLUGIN,
                               Stage1Ins, "the server").loss_share
    pid = strategy.federation.partition_of(sent.metadata.dst_node_id)
    for share in (None, 1.5):
        with pytest.raises(ClientFailure, match=rf"^client {pid} sent a bad message: key 'loss-share' is {share}"):
            strategy.aggregate_train(1, [stage1_answer(sent, ARRAYS, 4.0, share)])
    # Every LID alike; clients 2, 5 and 8 find most of their samples noisy.
    strategy = fedcorr("strategy.client_score=loss_share")
    stage1_iterations(strategy, lambda pid: 5.0, grid=Correcting(CorrectRes(n_relabeled=0, mu_hat=0.6)),
                      share=lambda pid: 0.7 if pid in (2, 5, 8) else 0.1)
    assert strategy.monitor is not None and strategy.monitor.detected == [2, 5, 8]


def test_bic_components_flag_every_client_outside_the_lowest_and_refuse_a_guard(flower_identity, monkeypatch):
    # Two clean clients, four a little noisy, four very: two components put the little noisy with the clean.
    three_levels = lambda pid: (1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 9.0, 9.0, 9.0, 9.0)[pid]  # noqa: E731
    paper, chosen = fedcorr(), FedCorr(strategy_settings("fedcorr", *SMOKE, "strategy.client_components=bic"),
                                       context(num_clients=10, seed=7))
    bound(chosen)
    seeds: list[int] = []

    def seeded(values: np.ndarray, seed: int) -> np.ndarray:
        seeds.append(seed)
        return above_lowest(values, seed)

    monkeypatch.setattr(fedcorr_module, "above_lowest", seeded)
    for strategy in (paper, chosen):
        stage1_iterations(strategy, three_levels, grid=Correcting(CorrectRes(n_relabeled=0, mu_hat=0.3)))
    assert seeds == [7], "the mixture is seeded with the run's seed, as the paper's split"
    assert chosen.monitor is not None and chosen.monitor.detected == [2, 3, 4, 5, 6, 7, 8, 9]
    assert paper.monitor is not None and paper.monitor.detected == [6, 7, 8, 9]
    with pytest.raises(ConfigError, match=r"strategy.client_split_guard='bic' is invalid: none with "
                                          r"client_components=bic"):
        fedcorr("strategy.client_components=bic", "strategy.client_split_guard=bic")


def test_the_guards_line_names_the_score_it_split(flower_identity, caplog):
    strategy = fedcorr("strategy.client_split_guard=bic", "strategy.client_score=iteration")
    with caplog.at_level(logging.INFO, logger="strategies.fedcorr"):
        stage1_iterations(strategy, lambda pid: 20.0 + 0.1 * pid)
    line = "FedCorr: the bic guard finds one population in the clients' iteration scores; no client is flagged"
    assert line in caplog.messages


def test_stage_2_finetunes_on_every_client_whose_noise_estimate_is_at_most_kappa(flower_identity):
    # Nobody flagged in the preset's 3 iterations: every mu_hat is 0, which kappa = 0 still admits.
    strategy = fedcorr("strategy.kappa=0")
    stage1_iterations(strategy, *[lambda pid: 5.0] * 3)
    assert strategy.stage == FINETUNE and strategy.clean == list(range(10))
    assert strategy.monitor is not None and list(strategy.monitor.label_noise) == ["before", "after_stage1"]


def test_the_end_of_stage_2_without_a_stage_3_ends_the_run():
    # Every client clean: stage 2's relabelling asks nobody, so no grid is needed to close it.
    strategy = fedcorr("strategy.t3=0")
    strategy.stage, strategy.clean, strategy._finetune_left = FINETUNE, list(range(10)), 0  # its rounds done
    strategy.finish(None, ARRAYS)
    assert strategy.stage == DONE and strategy.state()["stage"] == DONE
    assert strategy.monitor is not None and list(strategy.monitor.label_noise) == ["before", "after_stage2"]


class Correcting:
    """Clients answering ``query.correct`` with ``res`` (a stage-1 reply must carry mu_hat)."""

    def __init__(self, res: CorrectRes | LidRes) -> None:
        self.res = res

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return [Message(content=reply(self.res), reply_to=message) for message in messages]


class Disagreeing(Correcting):
    """Clients answering ``query.loss`` with accuracy 1 - ``disagreement(pid)`` (None: a reply without
    scores) and corrections with ``res``; records who was asked what."""

    def __init__(self, res: CorrectRes, disagreement: Callable[[int], float | None], strategy: FedCorr) -> None:
        super().__init__(res)
        self.disagreement, self.strategy = disagreement, strategy
        self.asked: list[tuple[str, int]] = []

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        out = []
        for message in messages:
            pid = self.strategy.federation.partition_of(message.metadata.dst_node_id)
            kind = message.metadata.message_type
            self.asked.append((kind, pid))
            if kind == LOSS:
                assert read_arrays(message.content, "the server") == ARRAYS, "the iteration's global model"
                share = self.disagreement(pid)
                scores = self.res if share is None else Scores(loss=1.0, accuracy=1.0 - share, num_examples=10)
                out.append(Message(content=reply(scores), reply_to=message))
            else:
                out.extend(super().send_and_receive([message], timeout=timeout))
        return out


def test_the_disagreement_score_asks_every_client_of_the_iteration_and_splits_on_one_minus_accuracy(
        flower_identity):
    strategy = fedcorr("strategy.client_score=disagreement")
    # Every LID alike; the global model disagrees with most labels of clients 1, 4 and 6.
    grid = Disagreeing(CorrectRes(n_relabeled=0, mu_hat=0.6), lambda pid: 0.7 if pid in (1, 4, 6) else 0.2,
                       strategy)
    stage1_iterations(strategy, lambda pid: 5.0, lambda pid: 5.0, grid=grid)
    assert strategy.monitor is not None and strategy.monitor.detected == [1, 4, 6]
    first, second = strategy.monitor.iterations
    assert first["disagreement"] == {str(pid): pytest.approx(0.7 if pid in (1, 4, 6) else 0.2) for pid in range(10)}
    assert [pid for kind, pid in grid.asked if kind == LOSS] == list(range(10)) * 2, "each iteration, everyone"
    assert strategy.monitor.results()["disagreement_queries"] == 20, "counted apart from the training rounds"
    assert sorted(pid for kind, pid in grid.asked if kind != LOSS) == [1, 1, 4, 4, 6, 6], "then the flagged correct"
    # The split reads the answers: a client whose model agrees with its labels is not flagged.
    strategy = fedcorr("strategy.client_score=disagreement")
    stage1_iterations(strategy, lambda pid: 9.0 if pid in (1, 4, 6) else 1.0,
                      grid=Disagreeing(CorrectRes(n_relabeled=0, mu_hat=0.6), lambda pid: 0.8 if pid == 3 else 0.1,
                                       strategy))
    assert strategy.monitor is not None and strategy.monitor.detected == [3], "not the high-LID clients"
    # A reply without scores, or an accuracy outside [0, 1], is refused, naming the client.
    for share, refusal in ((None, r"key 'mu-hat' is not part of a Scores"),
                           (-0.5, r"key 'accuracy' is 1.5: a share in")):
        strategy = fedcorr("strategy.client_score=disagreement")
        grid = Disagreeing(CorrectRes(n_relabeled=0, mu_hat=0.6), lambda pid, share=share: share, strategy)
        with pytest.raises(ClientFailure, match=rf"^client \d+ sent a bad message: {refusal}"):
            stage1_iterations(strategy, lambda pid: 5.0, grid=grid)


@pytest.mark.parametrize(("rows", "keep"), [("all", None), ("noisy_subset", 0.2)])
def test_stage_2s_correction_asks_the_clients_outside_s_c_for_the_rows_and_keep_the_switches_name(
        flower_identity, rows, keep):
    strategy = fedcorr("strategy.t3=0", f"strategy.stage2_rows={rows}",
                       f"strategy.stage2_keep={'null' if keep is None else keep}")
    strategy.stage, strategy.clean, strategy._finetune_left = FINETUNE, list(range(7)), 0  # its rounds done
    sent: list[Message] = []

    class Recording(Correcting):
        def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
            batch = list(messages)
            sent.extend(batch)
            return super().send_and_receive(batch, timeout=timeout)

    strategy.finish(Recording(CorrectRes(n_relabeled=0)), ARRAYS)
    asked = {strategy.federation.partition_of(m.metadata.dst_node_id): read_instruction(m.content, CorrectIns)
             for m in sent}
    assert sorted(asked) == [7, 8, 9]
    assert {(ins.mode, ins.stage2_rows, ins.stage2_keep) for ins in asked.values()} == {("stage2", rows, keep)}


def flagged(pid: int) -> float:
    """Clients 7-9 stand apart in LID: the split flags them, and they are asked to correct."""
    return 9.0 if pid >= 7 else 1.0


@pytest.mark.parametrize(("res", "refusal"), [
    (CorrectRes(n_relabeled=0), "key 'mu-hat' is missing from a stage-1 correction"),
    (LidRes(lid=2.0), "key 'lid' is not part of a CorrectRes"),
])
def test_a_stage_1_correction_that_is_not_one_or_lacks_mu_hat_is_refused_naming_the_client(
        flower_identity, res, refusal):
    with pytest.raises(ClientFailure, match=rf"^client 7 sent a bad message: {refusal}.*; client 8 .*; client 9 "):
        stage1_iterations(fedcorr(), flagged, grid=Correcting(res))


def test_the_flagged_clients_noise_estimates_are_kept_and_the_others_are_0(flower_identity):
    answered = fedcorr()
    stage1_iterations(answered, flagged, grid=Correcting(CorrectRes(n_relabeled=0, mu_hat=0.3)))
    assert answered.monitor is not None and answered.monitor.detected == [7, 8, 9]
    assert answered.mu_hat == {pid: 0.3 if pid >= 7 else 0.0 for pid in range(10)}


def test_a_budget_below_stages_1_2_is_refused_naming_them():
    settings = strategy_settings("fedcorr", *SMOKE)  # 3 iterations of 10 clients, then 5 rounds of 3
    assert settings.stage3_rounds(context(comm_budget=51)) == 2
    with pytest.raises(ConfigError, match=r"^comm_budget=44 is invalid: too small; FedCorr's stages 1-2 alone spend "
                                          r"45 client participations$"):
        settings.stage3_rounds(context(comm_budget=44))


def test_stage_3_takes_frac2_n_clients_a_round_down_to_one():
    strategy = fedcorr("strategy.frac2=0.1")  # 10 clients: one a round in stages 2 and 3
    assert [strategy.planned_clients(r) for r in (31, 36)] == [1, 1]
