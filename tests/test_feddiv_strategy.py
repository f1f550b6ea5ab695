"""FedDiv's server side beyond tests/test_feddiv.py: the client instruction's eta and seed, the budget
check and the rounds a budget leaves, the stage before the first round and the stage ends, the global
filter sent in a main round and aggregated with squared weights, the round each global filter is
logged under, the reply checks naming their sender, and the result block before binding."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
from defaults import context, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from test_feddiv import TRAINING, filter_replies

from common.errors import ConfigError
from protocol.codec import ProtocolError
from protocol.feddiv import PLUGIN, FedDivIns
from protocol.messages import TrainStats, read_plugin_ins, reply
from strategies.feddiv import MAIN, WARMUP, FedDiv, FedDivSettings
from strategies.federation import Federation
from task.noise_filter import NoiseFilter, aggregate_filters

NUM_CLIENTS = 4
ARRAYS = ArrayRecord({"w": Array(np.zeros(2, np.float32))})


def settings(warmup_iterations: int = 1, **changes: Any) -> FedDivSettings:
    """Three main rounds of half of four clients (2 a round) after ``warmup_iterations`` sequential
    iterations (4 one-client rounds each)."""
    return strategy_settings("feddiv", num_rounds=3, fraction=0.5, train=TRAINING,
                             warmup_iterations=warmup_iterations, **changes)


def strategy(warmup_iterations: int = 1, bound: bool = True, strategy_context: Any = None,
             **changes: Any) -> FedDiv:
    """A FedDiv over four clients of ten samples each, bound unless ``bound`` is false."""
    made = FedDiv(settings(warmup_iterations, **changes), strategy_context or context(num_clients=NUM_CLIENTS))
    if bound:
        made.bind(Federation(node_of={pid: 100 + pid for pid in range(NUM_CLIENTS)},
                             num_examples=dict.fromkeys(range(NUM_CLIENTS), 10)))
    return made


@pytest.mark.parametrize(("eta", "iid", "expected"), [(None, True, 0.0), (None, False, 1.0), (0.5, True, 0.5),
                                                      (0.0, False, 0.0)])
def test_the_regulariser_weight_is_off_on_iid_on_otherwise_and_a_given_eta_wins(eta: float | None, iid: bool,
                                                                                expected: float) -> None:
    """A null eta means 1 on non-IID partitions and 0 on IID ones (the paper's L_reg); a set eta is used as is."""
    ins = settings(eta=eta).client_ins(iid, seed=7, diagnostics=True)
    assert ins == FedDivIns(phase=WARMUP, params=ins.params, eta=expected, seed=7, diagnostics=True)
    assert ins.seed == 7, "the run's seed reaches the clients (their mixture seeds derive from it)"


@pytest.mark.parametrize(("iid", "expected"), [(True, 0.0), (False, 1.0)])
def test_the_strategy_tells_clients_the_scenes_partition_kind_and_seed(iid: bool, expected: float) -> None:
    """The instruction's eta follows the context's ``iid`` and carries its seed."""
    made = strategy(strategy_context=context(num_clients=NUM_CLIENTS, seed=5, iid=iid))
    assert (made.ins.eta, made.ins.seed, made.ins.phase) == (expected, 5, WARMUP)


def test_a_budget_leaving_one_main_round_is_accepted_and_one_leaving_none_is_refused() -> None:
    """The warm-up spends 4 participations; rounds spend 2: a budget of 6 leaves exactly one main round
    (allowed), 5 leaves none (the error names the warm-up's spend and the missing main round)."""
    settings().check_run(context(num_clients=NUM_CLIENTS, comm_budget=6))
    with pytest.raises(ConfigError) as refused:
        settings().check_run(context(num_clients=NUM_CLIENTS, comm_budget=5))
    assert str(refused.value) == ("comm_budget=5 is invalid: too small; FedDiv's warm-up spends 4 participations "
                                  "and leaves no main round")


def test_a_budget_sets_the_main_rounds() -> None:
    """A budget of 8: 4 warm-up participations, then (8 - 4) / 2 = 2 main rounds instead of num_rounds=3."""
    made = strategy(strategy_context=context(num_clients=NUM_CLIENTS, comm_budget=8))
    assert (made.num_rounds, made.planned_rounds()) == (2, 6)
    assert strategy().planned_rounds() == 4 + 3


@pytest.mark.parametrize(("warmup_iterations", "stage", "ends"), [(1, WARMUP, [4]), (0, MAIN, [])])
def test_the_stage_before_any_round_and_the_stage_ends(caplog: pytest.LogCaptureFixture, warmup_iterations: int,
                                                       stage: str, ends: list[int]) -> None:
    """Before the first round the strategy is in its warm-up if it has one (the summary line says so),
    and the server keeps a checkpoint after the warm-up's last round, none without a warm-up."""
    made = strategy(warmup_iterations)
    assert made.stage == stage
    with caplog.at_level(logging.INFO, logger="strategies.fedavg"):
        made.summary()
    assert f"stage={stage}," in caplog.text
    assert made.stage_ends() == ends


def main_ins(made: FedDiv, server_round: int) -> list[FedDivIns]:
    """The FedDiv instructions of one configured round."""
    messages = list(made.configure_train(server_round, ARRAYS, ConfigRecord(), None))
    return [read_plugin_ins(m.content, PLUGIN, FedDivIns) for m in messages]


def test_a_main_round_sends_the_current_global_filter(flower_identity: None) -> None:
    """The first main round has no global filter yet; after one is aggregated the next round sends it."""
    made = strategy(warmup_iterations=0)
    first = main_ins(made, 1)
    assert len(first) == 2 and all(ins.phase == MAIN and ins.filter is None for ins in first)
    f = NoiseFilter(0.1, 0.6, 0.01, 0.02, 0.7, 0.3)
    made.aggregate(filter_replies({0: f, 1: f}))
    second = main_ins(made, 2)
    assert len(second) == 2 and all(asdict(ins.filter) == pytest.approx(asdict(f)) for ins in second)


def test_squared_variance_aggregation_narrows_the_global_filter() -> None:
    """``variance_aggregation=squared`` weighs the variances by gamma_k^2 (the released code), not gamma_k."""
    a, b = NoiseFilter(0.1, 0.7, 0.01, 0.02, 0.8, 0.2), NoiseFilter(0.3, 0.9, 0.03, 0.04, 0.6, 0.4)
    made = strategy(warmup_iterations=0, variance_aggregation="squared")
    made.aggregate({**filter_replies({0: a}, size=30), **filter_replies({1: b}, size=10)})
    assert made.global_filter is not None
    assert made.global_filter.var_clean == pytest.approx(0.75 ** 2 * 0.01 + 0.25 ** 2 * 0.03)
    assert asdict(made.global_filter) == pytest.approx(asdict(aggregate_filters([a, b], [30.0, 10.0],
                                                                                squared_weights=True)))


def test_each_global_filter_is_logged_under_its_round_counting_the_warmup() -> None:
    """After 4 warm-up rounds, the first main round's global filter is round 5's."""
    made = strategy(warmup_iterations=1)
    made.stage, made.stage_rounds = MAIN, 4
    f = NoiseFilter(0.1, 0.6, 0.01, 0.02, 0.7, 0.3)
    made.aggregate(filter_replies({2: f}))
    assert made.monitor is not None
    assert [row["round"] for row in made.monitor.results()["global_filters"]] == [5]


def train_reply(shape: tuple[int, ...], with_filter: bool) -> RecordDict:
    """A client's train reply with arrays of ``shape``, and its FedDiv report if ``with_filter``."""
    from protocol.feddiv import FedDivRes

    extra = FedDivRes(filter=NoiseFilter(0.1, 0.6, 0.01, 0.02, 0.7, 0.3), noise_estimate=0.2, relabeled=0,
                      trained=10) if with_filter else None
    return reply(TrainStats(10, 0.1, 1), arrays=ArrayRecord({"w": Array(np.zeros(shape, np.float32))}),
                 extra=extra, plugin=PLUGIN)


def test_a_reply_unlike_the_global_model_is_refused_naming_the_client(flower_identity: None) -> None:
    """The round's global arrays are what replies are checked against; the error names the sender."""
    made = strategy(warmup_iterations=1)
    main_ins(made, 1)
    with pytest.raises(ProtocolError, match=r"^client 3 sent a bad message: key 'arrays' .*shape \(3,\)"):
        made.read_train(train_reply((3,), with_filter=False), "client 3")
    assert made.read_train(train_reply((2,), with_filter=False), "client 3").extra is None


def test_a_main_reply_without_the_feddiv_report_is_refused_naming_the_client(flower_identity: None) -> None:
    """In the main phase a reply must carry the client's FedDivRes; the error names the sender."""
    made = strategy(warmup_iterations=0)
    main_ins(made, 1)
    content = train_reply((2,), with_filter=False)
    with pytest.raises(ProtocolError, match=r"^client 3 sent a bad message: key 'feddiv' is missing"):
        made.read_train(content, "client 3")
    content[PLUGIN] = MetricRecord({"noise-estimate": 0.2})
    with pytest.raises(ProtocolError, match=r"^client 3 sent a bad message"):
        made.read_train(content, "client 3")
    good = made.read_train(train_reply((2,), with_filter=True), "client 3")
    assert good.extra.noise_estimate == 0.2


def test_an_unbound_strategy_has_no_result_block() -> None:
    """Before the server binds the federation there is no monitor, so no ``feddiv`` block."""
    assert strategy(bound=False).result_blocks() == {}
    assert set(strategy().result_blocks()) == {"feddiv"}
