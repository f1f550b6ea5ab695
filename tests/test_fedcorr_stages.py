"""FedCorr's stage machine over the in-process test grid: the real ServerApp logic and the real
ClientApp handlers, no Ray (digits, 10 clients, 1 local epoch)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from common.errors import ConfigError
from protocol.fedcorr import CORRECT
from protocol.messages import CONFIG, TRAIN
from strategies import fedcorr
from strategies.rounds import rounds_left

SMALL = "experiment=smoke strategy=fedcorr strategy.train.epochs=1 strategy.t1=2 strategy.t2=2 strategy.t3=2"
N, M = 10, 3  # clients; clients per stage-2/3 round (frac2 = 0.3 in the smoke preset)


def stages(payload: dict) -> list[str]:
    return [row["stage"] for row in payload["rounds"]]


def train_configs(grid) -> list:
    """The config record of every delivered train message, in order."""
    return [message.content[CONFIG] for message in grid.delivered if message.metadata.message_type == TRAIN]


def test_stages_run_in_order_and_spend_the_paper_budget(run_inprocess):
    payload, _ = run_inprocess(SMALL)
    assert stages(payload) == ["preprocess"] * (2 * N) + ["finetune"] * 2 + ["usual"] * 2
    clean = payload["fedcorr"]["finetune_clients"]
    assert payload["summary"]["comm_cost"] == 2 * N + 2 * min(M, len(clean)) + 2 * M
    stage1 = [row["clients"] for row in payload["rounds"] if row["stage"] == "preprocess"]
    for iteration in range(2):
        visited = [c for clients in stage1[iteration * N:(iteration + 1) * N] for c in clients]
        assert sorted(visited) == list(range(N)), "every client trains exactly once per iteration"
    assert all(set(row["clients"]) <= set(clean) for row in payload["rounds"] if row["stage"] == "finetune")


def test_corrections_follow_each_iteration_and_stage_2(run_inprocess):
    # Two local epochs: after one, the local models are too weak for the local-loss split to find
    # the noisy samples, and nothing gets relabelled.
    payload, grid = run_inprocess(SMALL + " strategy.train.epochs=2")
    kinds = grid.delivered_types()
    configs = [m.content[CONFIG] for m in grid.delivered if m.metadata.message_type == CORRECT]
    detected = [len(it["detected_noisy_clients"]) for it in payload["fedcorr"]["iterations"]]
    outside = N - len(payload["fedcorr"]["finetune_clients"])
    assert [c["mode"] for c in configs] == ["stage1"] * sum(detected) + ["stage2"] * outside
    # A stage-1 split takes local losses from this iteration's training only (round 1, then N + 1);
    # every loss GMM seeds from the run's seed; ground truth is on, so counts come back.
    assert [c["losses-since"] for c in configs[:sum(detected)]] == [1] * detected[0] + [N + 1] * detected[1]
    assert {(c["seed"], c["relabel"], c["diagnostics"]) for c in configs} == {(payload["config"]["seed"], True, True)}
    assert {c["stage2-rows"] for c in configs} == {"all"}, "stage 2 relabels every confident sample (Sec. 3.3)"
    # Iteration 1's corrections come after its last train round and before iteration 2's first.
    first_correct = kinds.index(CORRECT)
    assert kinds[:first_correct].count(TRAIN) == N
    block = payload["fedcorr"]
    assert block["label_noise"]["after_stage2"] < block["label_noise"]["before"]
    assert block["relabeled"] > 0 and 0 <= block["relabel_precision"] <= 1
    steps = block["relabel_by_step"]
    assert set(steps) <= {"stage1", "stage2"}
    assert sum(step["relabeled"] for step in steps.values()) == block["relabeled"]


def test_the_loss_share_split_flags_the_clients_whose_losses_say_so_and_their_mu_hat_is_that_share(run_inprocess):
    payload, _ = run_inprocess(SMALL + " strategy.train.epochs=2 strategy.client_score=loss_share")
    for iteration in payload["fedcorr"]["iterations"]:
        shares, mu_hat = iteration["loss_share"], iteration["mu_hat"]
        assert set(shares) == {str(pid) for pid in range(N)}
        flagged = iteration["detected_noisy_clients"]
        assert flagged and min(shares[str(pid)] for pid in flagged) > max(
            share for pid, share in shares.items() if int(pid) not in flagged)
        # The correction splits the same kept losses with the same seed: mu_hat is the share sent.
        assert all(mu_hat[str(pid)] == pytest.approx(shares[str(pid)]) for pid in flagged)


def test_fraction_scheduling_sets_the_stage_1_round_size(run_inprocess):
    payload, _ = run_inprocess(f"{SMALL} strategy.frac1=0.3 strategy.t2=0 strategy.t3=0")
    assert [len(row["clients"]) for row in payload["rounds"]] == [3, 3, 3, 1] * 2
    without, _ = run_inprocess(f"{SMALL} strategy.frac1=0.3 strategy.frac2=0.5 strategy.t2=0 strategy.t3=0 "
                               "strategy.ablation.fraction_scheduling=false")
    assert [len(row["clients"]) for row in without["rounds"]] == [5, 5] * 2, "frac2 N per round without scheduling"


def test_an_empty_clean_set_falls_back_to_the_lowest_noise_estimates(run_inprocess, caplog, monkeypatch):
    # A 2-component split always leaves someone clean; to reach the fallback the split flags every
    # client, and with every client at least half noisy none estimates mu_hat <= kappa = 0.1.
    monkeypatch.setattr(fedcorr, "high_component", lambda scores, seed, guard: np.ones(len(scores), dtype=bool))
    with caplog.at_level(logging.WARNING):
        payload, _ = run_inprocess(f"{SMALL} noise.rho=1.0 noise.tau=0.5")
    clean = payload["fedcorr"]["finetune_clients"]
    mu_hat = {row["client"]: row["mu_hat"] for row in payload["fedcorr"]["clients"]}
    assert len(clean) == M
    assert f"no client has mu_hat <= kappa=0.1; finetuning on the 3 lowest-mu_hat clients {clean}" in caplog.messages
    assert max(mu_hat[c] for c in clean) <= min(mu_hat[c] for c in mu_hat if c not in clean)


@pytest.mark.parametrize("switch", ["correction", "local_proximal", "mixup", "finetuning", "usual_training"])
def test_each_table_6_switch_removes_its_component(run_inprocess, switch):
    # Two local epochs where correction is off: with one, nothing would be relabelled anyway.
    epochs = 2 if switch == "correction" else 1
    payload, grid = run_inprocess(f"{SMALL} strategy.ablation.{switch}=false strategy.train.epochs={epochs}")
    block = payload["fedcorr"]
    stage1 = train_configs(grid)[: 2 * N]
    if switch == "correction":
        assert block["relabeled"] == 0 and block["label_noise"]["after_stage2"] == block["label_noise"]["before"]
        assert all(m.content[CONFIG]["relabel"] is False for m in grid.delivered
                   if m.metadata.message_type == CORRECT)
        assert any(value > 0 for row in block["clients"] for value in [row["mu_hat"]]), "mu_hat is still estimated"
    if switch == "local_proximal":
        assert all(config["prox-weight"] == 0.0 for config in stage1)
    else:
        # Iteration 2 pulls each noisy client towards the global model with beta * mu_hat.
        assert any(config["prox-weight"] > 0 for config in stage1[N:])
    if switch == "mixup":
        assert all(config["learner"] == "ce" for config in stage1)
    else:
        assert all(config["learner"] == "mixup" and config["mixup-alpha"] == 1.0 for config in stage1)
    expected = ["preprocess"] * (2 * N) + ["finetune"] * (0 if switch == "finetuning" else 2) \
        + ["usual"] * (0 if switch == "usual_training" else 2)
    assert stages(payload) == expected
    stage2 = [m for m in grid.delivered if m.metadata.message_type == CORRECT and m.content[CONFIG]["mode"] == "stage2"]
    assert len(stage2) == N - len(block["finetune_clients"]), "stage 2's relabelling runs with every switch"


def test_a_comm_budget_gives_stage_3_what_stages_1_and_2_leave(run_inprocess):
    payload, _ = run_inprocess(f"{SMALL} comm_budget=41")
    # 2 x 10 (stage 1) + 2 x 3 (stage 2) = 26; (41 - 26) // 3 = 5 rounds of stage 3.
    assert stages(payload).count("usual") == 5


def test_a_budget_that_stages_1_and_2_spend_whole_leaves_no_round_and_a_smaller_one_is_refused():
    assert rounds_left(26, 26, 3, "stages 1-2") == 0 and rounds_left(41, 26, 3, "stages 1-2") == 5
    message = r"^comm_budget=25 is invalid: too small; stages 1-2 alone spend 26 client participations$"
    with pytest.raises(ConfigError, match=message):
        rounds_left(25, 26, 3, "stages 1-2")


def test_without_ground_truth_no_label_noise_figure_is_reported(run_inprocess, capsys):
    payload, grid = run_inprocess(f"{SMALL} ground_truth=false")
    block = payload["fedcorr"]
    assert {"detection", "label_noise", "relabel_precision", "noise_estimate_mae",
            "true_noisy_clients"}.isdisjoint(block)
    assert block["detected_noisy_clients"] is not None and len(block["iterations"]) == 2
    assert all("detection" not in it and "label_noise" not in it for it in block["iterations"])
    assert all(not m.content[CONFIG]["diagnostics"] for m in grid.delivered if m.metadata.message_type == CORRECT)
    assert "label noise" not in capsys.readouterr().out


@pytest.mark.parametrize("stage3", ["fedprox", "feddyn", "fedmedian", "poc"])
def test_each_round_strategy_runs_as_stage_3(run_inprocess, stage3):
    payload, _ = run_inprocess(f"{SMALL} strategy.t1=1 strategy.stage3={stage3} strategy.stage3_options.poc.d=6")
    assert stages(payload)[-2:] == ["usual", "usual"]
    assert payload["summary"]["comm_cost"] == payload["rounds"][-1]["comm_cost"]
    if stage3 == "poc":
        assert payload["poc"]["loss_queries"] == 2 * 6
