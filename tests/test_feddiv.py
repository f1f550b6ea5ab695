"""FedDiv: its maths on hand-computed inputs (the filter's posterior, EM and aggregation, the
consistency sampler, the local prior, the uniform-prior regulariser), the client's prior across
recreated client processes, its settings, and whole in-process runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from protocol.codec import decode, encode
from protocol.feddiv import FedDivOptions, FedDivReport
from task.consistency import consistent, debiased_labels, updated_prior
from task.learners.uniform_prior import uniform_prior_penalty
from task.noise_filter import NoiseFilter, aggregate_filters, clean_posterior, fit_filter, min_max


def test_min_max_scales_to_unit_range():
    np.testing.assert_allclose(min_max(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(min_max(np.array([3.0, 3.0])), [0.0, 0.0])


def test_the_clean_posterior_is_bayes_rule_on_the_two_gaussians():
    f = NoiseFilter(0.2, 0.8, 0.01, 0.04, 0.7, 0.3)
    x = np.array([0.1, 0.5, 0.9])

    def density(v, m, var):
        return math.exp(-(v - m) ** 2 / (2 * var)) / math.sqrt(2 * math.pi * var)

    expected = [0.7 * density(v, 0.2, 0.01) / (0.7 * density(v, 0.2, 0.01) + 0.3 * density(v, 0.8, 0.04))
                for v in x]
    np.testing.assert_allclose(clean_posterior(x, f), expected, rtol=1e-10)


def test_em_finds_two_separated_groups_and_orders_clean_first():
    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(0.1, 0.03, 300), rng.normal(0.85, 0.05, 100)])
    fitted = fit_filter(losses, seed=0)
    assert fitted.mean_clean == pytest.approx(0.1, abs=0.02) and fitted.mean_noisy == pytest.approx(0.85, abs=0.02)
    assert fitted.weight_clean == pytest.approx(0.75, abs=0.02)
    # From a global filter with the components the other way round, EM still ends clean-first.
    start = NoiseFilter(0.5, 0.2, 0.05, 0.05, 0.5, 0.5)
    warm = fit_filter(losses, seed=0, start=start)
    assert warm.mean_clean < warm.mean_noisy
    # Three EM steps from a poor start stay short of the converged fit.
    few = fit_filter(losses, seed=0, start=NoiseFilter(0.45, 0.55, 0.1, 0.1, 0.5, 0.5), max_iterations=1)
    assert abs(few.mean_clean - fitted.mean_clean) > 1e-3


def test_filters_average_with_size_weights_and_squared_weights_narrow_the_variances():
    a = NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2)
    b = NoiseFilter(0.3, 0.9, 0.03, 0.04, 0.6, 0.4)
    linear = aggregate_filters([a, b], [30.0, 10.0])
    assert linear.mean_clean == pytest.approx(0.75 * 0.1 + 0.25 * 0.3)
    assert linear.var_noisy == pytest.approx(0.75 * 0.02 + 0.25 * 0.04)
    assert linear.weight_noisy == pytest.approx(0.75 * 0.2 + 0.25 * 0.4)
    squared = aggregate_filters([a, b], [30.0, 10.0], squared_weights=True)
    assert squared.mean_clean == linear.mean_clean
    assert squared.var_clean == pytest.approx(0.75 ** 2 * 0.01 + 0.25 ** 2 * 0.03)


def test_the_sampler_keeps_candidates_whose_global_and_debiased_local_predictions_agree():
    logits = torch.tensor([[2.0, 1.8], [0.0, 1.0], [3.0, 0.0], [1.0, 1.05]])
    prior = np.array([0.8, 0.2])
    # xi = 0.5: logits - 0.5 log(prior) = logits + (0.1116, 0.8047).
    local = debiased_labels(logits, prior, xi=0.5)
    np.testing.assert_array_equal(local, [1, 1, 0, 1])
    np.testing.assert_array_equal(debiased_labels(logits, prior, xi=0.0), [0, 1, 0, 1])
    global_labels = np.array([0, 1, 0, 0])
    np.testing.assert_array_equal(consistent(np.array([0, 1, 2, 3]), global_labels, local), [1, 2])
    np.testing.assert_array_equal(consistent(np.array([1, 3]), global_labels, local), [1])


def test_the_local_prior_is_a_moving_average_of_the_mean_prediction():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # softmax (0.5, 0.5) and (0.75, 0.25)
    prior = np.array([0.5, 0.5])
    np.testing.assert_allclose(updated_prior(prior, logits, momentum=0.2, xi=0.5),
                               0.2 * prior + 0.8 * np.array([0.625, 0.375]))
    # With a confidence bar only the confident row counts; none confident keeps the prior.
    np.testing.assert_allclose(updated_prior(prior, logits, 0.2, 0.0, confidence=0.7),
                               0.2 * prior + 0.8 * np.array([0.75, 0.25]))
    np.testing.assert_allclose(updated_prior(prior, logits, 0.2, 0.0, confidence=0.9), prior)


def test_the_uniform_prior_penalty_is_kl_from_uniform_to_the_mean_prediction():
    logits = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])  # mean prediction (0.75, 0.25)
    expected = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert uniform_prior_penalty(logits).item() == pytest.approx(expected, rel=1e-6)
    assert uniform_prior_penalty(torch.zeros(3, 4)).item() == pytest.approx(0.0, abs=1e-7)


def test_options_and_report_travel_through_the_codec():
    options = FedDivOptions(phase="main", filter=NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2), eta=1.0, seed=3)
    record = encode(options)
    assert record["filter.mean-clean"] == 0.1 and record["zeta"] == 0.75 and record["filter-init"] == "local_bootstrap"
    assert decode(FedDivOptions, record, "the server") == options
    no_filter = FedDivOptions(phase="main")
    assert decode(FedDivOptions, encode(no_filter), "the server").filter is None
    report = FedDivReport(filter=NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2), noise_estimate=0.25, relabeled=3,
                          trained=40)
    assert decode(FedDivReport, encode(report), "client 1") == report


@pytest.mark.parametrize(("overrides", "message"), [
    ("strategy.train.learner=sce", r"strategy.train.learner='sce' is invalid: ce: FedDiv's clients"),
    ("strategy.zeta=1.5", r"strategy.zeta=1.5 is invalid"),
    ("strategy.variance_aggregation=cubic", r"strategy.variance_aggregation='cubic' is invalid: allowed are linear"),
    # smoke: one warm-up iteration of 10 clients, then rounds of 3.
    ("comm_budget=5", r"comm_budget=5 is invalid: too small; FedDiv's warm-up alone spend 10"),
    ("comm_budget=12", r"comm_budget=12 is invalid: too small; FedDiv's warm-up spends 10 participations and "
                       r"leaves no"),
    ("strategy.min_clients=11", r"strategy.min_clients=11 is invalid: allowed is at most num_clients=10"),
])
def test_bad_settings_are_one_clear_error(overrides, message):
    from server.config import load_run
    from settings.compose import compose_config

    with pytest.raises(ConfigError, match=message):
        load_run(compose_config(["experiment=smoke", "strategy=feddiv", *overrides.split()]))


def test_a_smoke_run_warms_up_then_filters_and_finds_noisy_clients_better_than_chance(run_inprocess):
    payload, _ = run_inprocess("experiment=smoke strategy=feddiv strategy.warmup_iterations=1 "
                               "strategy.num_rounds=8 strategy.fraction=0.3")
    stages = [row["stage"] for row in payload["rounds"]]
    assert stages == ["warmup"] * 10 + ["main"] * 8
    assert [len(row["clients"]) for row in payload["rounds"]] == [1] * 10 + [3] * 8
    assert payload["summary"]["comm_cost"] == 10 + 24
    block = payload["feddiv"]
    assert len(block["global_filters"]) == 8
    f = block["global_filter"]
    assert f["mean_clean"] < f["mean_noisy"]
    assert abs(f["weight_clean"] + f["weight_noisy"] - 1) < 1e-9
    truth = set(block["true_noisy_clients"])
    # Every client's estimate above the threshold counts as detected; with ground truth, scored.
    estimates = {int(pid): value for pid, value in block["noise_estimates"].items()}
    assert set(block["detected_noisy_clients"]) == {pid for pid, value in estimates.items() if value >= 0.1}
    # Better than chance: the |truth| highest noise estimates hold more noisy clients than a random pick.
    highest = sorted(estimates, key=lambda pid: -estimates[pid])[:len(truth)]
    assert len(set(highest) & truth) > len(truth) ** 2 / 10
    # The filter flags wrong labels far more precisely than their share, and training sees less noise.
    given = block["label_noise"]["given"]
    assert block["sample_split"]["precision"] > 2 * given
    assert block["label_noise"]["trained"] < given
    assert block["relabeled"] > 0 and block["relabel_precision"] > 0.5


def test_the_local_prior_survives_a_restarted_supernode_and_training_continues_identically(
        prepared_run, incoming, tmp_path):
    from flwr.app import ArrayRecord, Context, RecordDict

    from client import app as client_app
    from client import node as client_node
    from client.methods.feddiv import load_prior
    from protocol.messages import TrainIns, instruction, read_arrays, read_extra
    from task.local_training import LocalTraining

    overrides, _, arrays = prepared_run("experiment=smoke strategy=feddiv")

    def context(state_dir) -> Context:
        config = {"partition-id": 4, **({"state-dir": str(state_dir)} if state_dir else {})}
        return Context(run_id=1, node_id=77, node_config=config, state=RecordDict(),
                       run_config={"overrides": overrides})

    def train(ctx: Context, server_round: int) -> ArrayRecord:
        options = FedDivOptions(phase="main", filter=NoiseFilter(0.1, 0.6, 0.01, 0.05, 0.7, 0.3), seed=1)
        content = instruction(TrainIns(server_round, LocalTraining(lr=0.05, epochs=2, batch_size=16), method="feddiv"),
                              arrays=arrays, options=options, method="feddiv")
        reply = client_app.train(incoming(content, "train"), ctx)
        report = read_extra(reply.content, "feddiv", FedDivReport, "client 4")
        assert 0.0 <= report.noise_estimate <= 1.0 and report.filter.mean_clean <= report.filter.mean_noisy
        return read_arrays(reply.content, "client 4")

    kept = context(None)
    train(kept, 1)
    prior = load_prior(kept, client_node.load_node(kept))
    assert prior.shape == (10,) and prior.sum() == pytest.approx(1.0) and not np.allclose(prior, 0.1)
    expected = train(kept, 2).to_torch_state_dict()

    first = context(tmp_path)
    train(first, 1)
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.npz")] == [
        "run-1/partition-4/feddiv-prior.npz"]
    restarted = context(tmp_path)  # an empty context.state: the prior comes from the disk
    np.testing.assert_allclose(load_prior(restarted, client_node.load_node(restarted)), prior)
    again = train(restarted, 2).to_torch_state_dict()
    assert all(torch.equal(again[key], expected[key]) for key in expected)
