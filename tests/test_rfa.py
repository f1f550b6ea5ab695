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


# Equal weights on 0, 0 and 3: from the mean 1, each step gives 3 / (2^(k+1) + 1) and the objective
# 1 + 1 / (2^(k+1) + 1), so 4/3, 6/5, 10/9, 18/17: improvements 2/15, 4/45, 8/153, which are 1/9, 2/25,
# 4/81 of the objective after them (1/10, 2/27, 4/85 of the one before).
LINE = np.array([[0.0], [0.0], [3.0]])


def test_the_steps_on_a_line_follow_the_hand_computed_sequence() -> None:
    """Four steps by hand: the medians 3/5, 1/3, 3/17, 1/11 and the objectives after each."""
    solution = weiszfeld(LINE, [1.0, 1.0, 1.0], smoothing=1e-9, max_iterations=4, tolerance=0.0)
    assert solution.iterations == 4
    np.testing.assert_allclose(solution.objectives, [4 / 3, 6 / 5, 10 / 9, 18 / 17, 34 / 33], rtol=1e-12)
    assert solution.median[0] == pytest.approx(3 / 33, rel=1e-12)


def test_the_stopping_rule_compares_the_improvement_with_the_objective_after_the_step() -> None:
    """The steps stop at the first improvement below ``tolerance`` times the new objective: 2/25
    (step 2) is below 0.085 of it, 1/9 (step 1) is not; measured against the objective before the
    step, 1/10 < 0.105 would already stop step 1; against the first step's objective (6/5) rather
    than the latest, step 2 would stop at 0.078, where the rule stops only at step 3 (4/81 < 0.078)."""
    assert weiszfeld(LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.105).iterations == 2
    assert weiszfeld(LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.085).iterations == 2
    assert weiszfeld(LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.078).iterations == 3
    assert weiszfeld(LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.12).iterations == 1


def test_scaling_the_points_scales_the_median_and_keeps_the_steps() -> None:
    """The tolerance is relative to the objective, so the same points in other units (times 100:
    objectives near 110) stop after the same steps, at 100 times the median."""
    small = weiszfeld(LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.078)
    large = weiszfeld(100.0 * LINE, [1.0] * 3, 1e-9, max_iterations=10, tolerance=0.078)
    assert small.iterations == large.iterations == 3
    assert large.median[0] == pytest.approx(100.0 * 3 / 17, rel=1e-12)
    assert large.objectives[-1] == pytest.approx(100.0 * 18 / 17, rel=1e-12)


def test_a_zero_tolerance_spends_the_whole_budget_even_at_the_median() -> None:
    """From the mean of two points with equal weights, already a median, each step stays there and
    improves the objective by exactly 0, which is not less than 0 times it: every step is taken."""
    solution = weiszfeld(np.array([[-1.0, 2.0], [1.0, 2.0]]), [1.0, 1.0], 1e-9, max_iterations=5, tolerance=0.0)
    assert solution.iterations == 5
    assert solution.objectives == [1.0] * 6
    np.testing.assert_array_equal(solution.median, [0.0, 2.0])


def test_weights_of_any_float_type_are_normalised_in_double_precision() -> None:
    """float32 weights 1, 1, 1 (1/3 in float32 is 0.33333334) still start from the exact mean 1 of
    0, 0 and 3, whose objective is 4/3."""
    solution = weiszfeld(LINE, np.ones(3, dtype=np.float32), 1e-9, max_iterations=1, tolerance=0.0)
    assert solution.objectives[0] == pytest.approx(4 / 3, rel=1e-12)
    assert solution.objectives[1] == pytest.approx(6 / 5, rel=1e-12)
    assert solution.median[0] == pytest.approx(3 / 5, rel=1e-12)


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


def test_the_median_of_one_model_is_that_model() -> None:
    """A round with a single client (a small fraction of a small federation) returns its model,
    integer buffers and all, after the steps, which cannot move a single point."""
    state = {"w": np.array([[1.5, -2.0]], np.float32), "bn.num_batches_tracked": np.array(7)}
    median, solution = geometric_median_state([state], [12.0], 1e-5, 4, 1e-6)
    assert list(median) == ["w", "bn.num_batches_tracked"]
    np.testing.assert_array_equal(median["w"], state["w"])
    assert median["w"].dtype == np.float32 and int(median["bn.num_batches_tracked"]) == 7
    # The objective is 0 throughout, and an improvement of 0 is not less than any share of 0: every step is taken.
    assert solution.iterations == 4 and solution.objectives == [0.0] * 5


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps, reason="longdouble is float64 here")
def test_the_median_is_computed_in_double_precision_whatever_the_float_type() -> None:
    """The points are taken in float64, so RFA's arithmetic does not depend on the platform's
    ``longdouble``: 1 + 2^-60 (held by an 80-bit longdouble, not by float64) comes back as 1, still
    a longdouble."""
    value = np.longdouble(1.0) + np.longdouble(2.0) ** -60
    assert value != np.longdouble(1.0)
    states = [{"w": np.array([value, 2.0], dtype=np.longdouble)} for _ in range(2)]
    median, _ = geometric_median_state(states, [1.0, 1.0], 1e-5, 4, 1e-6)
    assert median["w"].dtype == np.longdouble
    np.testing.assert_array_equal(median["w"], np.array([1.0, 2.0], dtype=np.longdouble))


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


def test_the_rfa_block_gives_the_steps_of_each_round_and_their_mean() -> None:
    """Before any round the mean is None; after a round with an outlier (the four steps of the
    budget) and one of two mirror-image clients (the mean is the median: the objective does not
    change, so the steps stop after one), the block lists 4 and 1 and their mean 2.5."""
    strategy = Rfa(strategy_settings("rfa", num_rounds=2, fraction=0.5, train=local_training()), context(num_clients=4))
    strategy.bind(Federation(node_of={pid: 100 + pid for pid in range(4)}, num_examples=dict.fromkeys(range(4), 10)))
    assert strategy.result_blocks() == {"rfa": {"weiszfeld_iterations": [], "mean_iterations": None}}

    def replies(values: dict[int, float]) -> dict[int, TrainReply]:
        return {pid: TrainReply(ArrayRecord({"w": Array(np.full(3, value, np.float32))}), TrainStats(10, 0.1, 1))
                for pid, value in values.items()}

    strategy.aggregate(replies({0: 1.0, 1: 1.1, 2: 0.9, 3: 100.0}))
    mirrored = strategy.aggregate(replies({0: -1.0, 1: 1.0}))["w"].numpy()
    np.testing.assert_array_equal(mirrored, 0.0)
    assert strategy.result_blocks() == {"rfa": {"weiszfeld_iterations": [4, 1], "mean_iterations": 2.5}}


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


@pytest.mark.parametrize("weights", [[0.0, 0.0], [1.0, -1.0], [float("nan"), 1.0]])
def test_weights_without_a_positive_sum_are_refused_not_turned_into_a_nan_model(weights):
    """A round whose clients all report no examples has no median: an error, as for FedAvg's average,
    instead of a model of NaNs."""
    states = [{"w": np.array([1.0, 2.0], dtype=np.float32)}, {"w": np.array([3.0, 4.0], dtype=np.float32)}]
    with pytest.raises(ValueError, match="weights must sum to a positive number"):
        geometric_median_state(states, weights, smoothing=1e-6, max_iterations=5, tolerance=1e-5)
