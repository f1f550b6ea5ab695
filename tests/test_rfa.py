"""RFA: the smoothed Weiszfeld algorithm on hand-checkable points, the geometric median of model
states, robustness to an outlying client, and whole runs over the test grid, standalone and as
FedCorr's stage 3."""

from __future__ import annotations

import numpy as np
import pytest
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord

from common.errors import ConfigError
from protocol.messages import TrainStats
from server.config import load_run
from settings.compose import compose_config
from strategies.base import TrainReply
from strategies.federation import Federation
from strategies.rfa import Rfa, geometric_median_state, weiszfeld

SMOKE = "experiment=smoke strategy.train.epochs=1"


def test_the_median_of_a_line_is_its_weighted_middle_point_not_the_mean():
    points = np.array([[0.0], [1.0], [10.0]])
    solution = weiszfeld(points, [1.0, 1.0, 1.0], smoothing=1e-9, max_iterations=200, tolerance=0.0)
    assert solution.median[0] == pytest.approx(1.0, abs=1e-4)
    weighted = weiszfeld(points, [5.0, 1.0, 1.0], smoothing=1e-9, max_iterations=200, tolerance=0.0)
    assert weighted.median[0] == pytest.approx(0.0, abs=1e-4)  # weight 5 of 7 on 0: the median is 0


def test_each_step_lowers_the_objective_and_a_minority_cannot_drag_the_median():
    rng = np.random.default_rng(0)
    honest = rng.normal(0.0, 0.1, size=(7, 5))
    points = np.vstack([honest, np.full((2, 5), 100.0)])
    solution = weiszfeld(points, [1.0] * 9, smoothing=1e-6, max_iterations=50, tolerance=0.0)
    assert all(later <= earlier + 1e-12 for earlier, later in zip(solution.objectives, solution.objectives[1:]))
    assert np.linalg.norm(solution.median - honest.mean(axis=0)) < 0.2
    assert np.linalg.norm(points.mean(axis=0) - honest.mean(axis=0)) > 20  # the mean is dragged away


def test_it_stops_at_the_iteration_budget_or_once_the_objective_settles():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    assert weiszfeld(points, [1.0] * 4, 1e-6, max_iterations=3, tolerance=0.0).iterations == 3
    assert weiszfeld(points, [1.0] * 4, 1e-6, max_iterations=100, tolerance=1.0).iterations == 1
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    one_step = weiszfeld(points, weights, 1e-6, max_iterations=1, tolerance=0.0)
    alpha = weights / weights.sum()
    start = alpha @ points  # the weighted mean
    beta = alpha / np.linalg.norm(points - start, axis=1)
    np.testing.assert_allclose(one_step.median, (beta / beta.sum()) @ points)


def test_a_state_median_keeps_shapes_and_dtypes_and_averages_integer_buffers():
    states = [{"w": np.full((2, 2), value, np.float32), "b": np.array([value], np.float32),
               "bn.num_batches_tracked": np.array(count)} for value, count in ((1.0, 3), (2.0, 4), (30.0, 20))]
    state, solution = geometric_median_state(states, [2.0, 3.0, 2.0], 1e-9, 200, 0.0)
    assert list(state) == ["w", "b", "bn.num_batches_tracked"]
    assert state["w"].shape == (2, 2) and state["w"].dtype == np.float32
    np.testing.assert_allclose(state["w"], 2.0, atol=1e-3)  # the middle client, not the mean near 10
    np.testing.assert_allclose(state["b"], 2.0, atol=1e-3)
    # (2 * 3 + 3 * 4 + 2 * 20) / 7 = 8.3, rounded: the weighted mean of the batch counts (unweighted: 9)
    assert int(state["bn.num_batches_tracked"]) == 8 and state["bn.num_batches_tracked"].dtype == np.array(3).dtype
    assert solution.iterations > 1


def test_the_strategy_aggregates_a_round_robustly_and_logs_the_steps():
    strategy = Rfa(strategy_settings("rfa", num_rounds=1, fraction=0.5, train=local_training()), context(num_clients=4))
    strategy.bind(Federation(node_of={pid: 100 + pid for pid in range(4)}, num_examples=dict.fromkeys(range(4), 10)))
    values = {0: 1.0, 1: 1.1, 2: 0.9, 3: 100.0}
    replies = {pid: TrainReply(ArrayRecord({"w": Array(np.full(3, value, np.float32))}), TrainStats(10, 0.1, 1))
               for pid, value in values.items()}
    aggregate = strategy.aggregate(replies)["w"].numpy()
    assert np.all(np.abs(aggregate - 1.0) < 0.5)  # four steps from the mean, 25.75
    assert strategy.result_blocks()["rfa"]["weiszfeld_iterations"] == [strategy.settings.max_iterations]


def test_the_strategy_weights_clients_by_local_set_size():
    strategy = Rfa(strategy_settings("rfa", num_rounds=1, fraction=0.5, train=local_training()), context(num_clients=2))
    strategy.bind(Federation(node_of={0: 100, 1: 101}, num_examples={0: 30, 1: 10}))
    replies = {pid: TrainReply(ArrayRecord({"w": Array(np.full(2, value, np.float32))}), TrainStats(n, 0.1, 1))
               for pid, (value, n) in {0: (0.0, 30), 1: (10.0, 10)}.items()}
    # The weighted median of two points is the heavier one; with equal weights any point between
    # them is a median, and the steps would stay at the mean, 5.
    assert np.all(strategy.aggregate(replies)["w"].numpy() < 0.5)


def test_rfa_runs_standalone_and_as_fedcorrs_stage_3(run_inprocess):
    payload, _ = run_inprocess(f"{SMOKE} strategy=rfa strategy.num_rounds=3")
    assert [row["stage"] for row in payload["rounds"]] == ["rfa"] * 3
    assert len(payload["rfa"]["weiszfeld_iterations"]) == 3 and payload["summary"]["best_acc"] > 0.2
    staged, _ = run_inprocess(f"{SMOKE} strategy.t1=1 strategy.t2=1 strategy.t3=2 strategy.stage3=rfa "
                              "strategy.stage3_options.rfa.max_iterations=2")
    assert [row["stage"] for row in staged["rounds"]].count("usual") == 2
    assert len(staged["rfa"]["weiszfeld_iterations"]) == 2 and max(staged["rfa"]["weiszfeld_iterations"]) <= 2


def test_the_settings_are_checked_with_the_config():
    with pytest.raises(ConfigError, match=r"^strategy.max_iterations=0 is invalid: allowed is an integer >= 1$"):
        load_run(compose_config(["experiment=smoke", "strategy=rfa", "strategy.max_iterations=0"]))
    with pytest.raises(ConfigError, match=r"^strategy.stage3_options.rfa.smoothing=0 is invalid"):
        load_run(compose_config(["experiment=smoke", "strategy.stage3=rfa", "strategy.stage3_options.rfa.smoothing=0"]))
