"""The base every strategy builds on, with a strategy of its own that scripts each round: the round
loop of ``start`` (which rounds, with which arrays, timeout and config), the state a checkpoint keeps
and gives back (``state``/``restore``, the run log's), and the messages a user reads."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from defaults import context
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from common.errors import ConfigError
from protocol.messages import StateScope
from strategies.base import FederatedStrategy, RoundInfo, RunLog, StrategySettings
from strategies.federation import Federation


@dataclass(frozen=True)
class TinySettings(StrategySettings):
    rounds: int = 3


class Tiny(FederatedStrategy):
    """Sends nothing; round r's aggregate is ``script[r]`` (none when missing), recorded as a round of
    client 0. ``calls`` keeps what the loop handed to ``configure_train`` and ``finish``."""

    name = "tiny"
    settings: TinySettings
    transient = FederatedStrategy.transient | {"script", "calls"}

    def __init__(self, settings: TinySettings, context: Any, script: dict[int, ArrayRecord] | None = None) -> None:
        super().__init__(settings, context)
        self.script = script or {}
        self.calls: list[tuple[Any, ...]] = []
        self.aggregated: list[int] = []
        self.best = 0.0

    def planned_rounds(self) -> int:
        return self.settings.rounds

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Any) -> list[Message]:
        self.calls.append(("configure", server_round, self.log.current, arrays, config))
        return []

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.aggregated.append(server_round)
        arrays = self.script.get(server_round)
        if arrays is not None:
            self.record_round(server_round, "tiny", [0], None, arrays)
        return arrays, None

    def finish(self, grid: Any, arrays: ArrayRecord) -> None:
        self.calls.append(("finish", grid, arrays, self.log.current))


class RecordingGrid:
    """Answers nothing; keeps the timeout of every exchange."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        self.timeouts.append(timeout)
        return []


def arrays(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full(2, value, np.float32))})


def tiny(rounds: int = 3, script: dict[int, ArrayRecord] | None = None, skip_failed: bool = False) -> Tiny:
    return Tiny(TinySettings(rounds=rounds), context(skip_failed=skip_failed), script)


def configured(strategy: Tiny) -> list[tuple[Any, ...]]:
    return [call[1:] for call in strategy.calls if call[0] == "configure"]


def test_start_runs_every_planned_round_with_the_last_aggregate_and_keeps_its_scores():
    """Round r starts from the last aggregate (a round without one keeps the arrays it had), each
    exchange waits ``timeout``, the train config reaches ``configure_train`` as given, ``evaluate_fn``
    scores each round's arrays (the observer's own scores of a round win), each checkpoint sees the
    round completed, and ``finish`` gets the final arrays after the last round."""
    start, first, third = arrays(0.0), arrays(1.0), arrays(3.0)
    strategy = tiny(3, {1: first, 3: third})
    strategy.observe(lambda info, new: MetricRecord({"accuracy": 0.9}) if info.round == 3 else None)
    checkpoints = []
    strategy.log.checkpoint = lambda rnd, new: checkpoints.append((rnd, new, strategy.log.state()["completed"]))
    scored = []
    scores = {1: MetricRecord({"acc": 0.1}), 2: None, 3: MetricRecord({"acc": 0.3})}

    def evaluate(rnd: int, new: ArrayRecord) -> MetricRecord | None:
        scored.append((rnd, new))
        return scores[rnd]

    grid = RecordingGrid()
    config = ConfigRecord({"lr": 0.5})
    result = strategy.start(grid, start, num_rounds=3, timeout=5, train_config=config, evaluate_fn=evaluate)
    assert configured(strategy) == [(1, 1, start, config), (2, 2, first, config), (3, 3, first, config)]
    assert all(call[3] is config for call in configured(strategy))
    assert grid.timeouts == [5, 5, 5] and strategy.timeout == 5.0
    assert scored == [(1, first), (2, first), (3, third)]
    assert result.evaluate_metrics_serverapp == {1: MetricRecord({"acc": 0.1}), 3: MetricRecord({"accuracy": 0.9})}
    assert checkpoints == [(1, first, 1), (2, first, 2), (3, third, 3)]
    assert strategy.calls[-1] == ("finish", grid, third, 4), "finish runs after the last round"
    assert strategy.log.completed == 3 and result.arrays is third


def test_start_waits_an_hour_and_configures_with_an_empty_record_by_default():
    """Without ``timeout`` an exchange waits 3600 s; without ``train_config`` each round gets an empty
    ConfigRecord (Flower's default), never None."""
    strategy = tiny(2)
    grid = RecordingGrid()
    strategy.start(grid, arrays(0.0))
    assert grid.timeouts == [3600, 3600] and strategy.timeout == 3600.0
    configs = [call[3] for call in configured(strategy)]
    assert len(configs) == 2 and all(isinstance(c, ConfigRecord) and len(c) == 0 for c in configs)


def test_start_refuses_a_number_of_rounds_the_strategy_does_not_plan():
    strategy = tiny(3)
    grid = RecordingGrid()
    with pytest.raises(ValueError, match=r"^Tiny runs 3 rounds; num_rounds=4 disagrees$"):
        strategy.start(grid, arrays(0.0), num_rounds=4)
    assert grid.timeouts == [] and strategy.calls == []


def test_start_continues_after_the_run_logs_last_round():
    """A restored run takes only the rounds after its checkpoint's; one restored at its last round
    runs none and returns the checkpoint's arrays, then still calls ``finish``."""
    start = arrays(7.0)
    strategy = tiny(3, {3: arrays(3.0)})
    strategy.log.restore({"rounds": [], "completed": 2, "train_metrics": {}, "evaluate_metrics": {}})
    strategy.start(RecordingGrid(), start)
    assert [call[0] for call in configured(strategy)] == [3] and strategy.aggregated == [3]

    done = tiny(3, {1: arrays(1.0)})
    done.log.restore({"rounds": [], "completed": 3, "train_metrics": {}, "evaluate_metrics": {}})
    grid = RecordingGrid()
    result = done.start(grid, start)
    assert grid.timeouts == [] and done.aggregated == []
    assert result.arrays is start and done.calls == [("finish", grid, start, 4)]


def test_exchange_waits_the_timeout_start_was_given_and_an_hour_before():
    strategy = tiny(1)
    strategy.bind(Federation(node_of={0: 5}, num_examples={0: 1}))
    grid = RecordingGrid()
    assert strategy.exchange(grid, {}, "train", lambda content, sender: content) == {}
    strategy.start(grid, arrays(0.0), timeout=5)
    strategy.exchange(grid, {}, "train", lambda content, sender: content)
    assert grid.timeouts == [3600.0, 5, 5.0]


def test_a_strategy_that_sent_nothing_waits_for_no_reply():
    assert tiny().collect([], lambda content, sender: content) == {}


def test_an_unbound_strategy_says_bind_must_come_first():
    with pytest.raises(RuntimeError, match=r"^bind\(federation\) must be called before the strategy starts$"):
        tiny().federation  # noqa: B018 - the property raises


def test_messages_carry_the_scope_of_the_round_in_progress(flower_identity):
    """Before the first round the run log's round in progress is 0, and messages are scoped to it."""
    strategy = tiny()
    strategy.bind(Federation(node_of={0: 5}, num_examples={0: 1}))
    asked = []
    strategy.log.scope = lambda rnd: asked.append(rnd) or StateScope(run="r", round=rnd)
    strategy.messages({0: RecordDict()}, "train")
    assert asked == [0] and strategy.log.completed == 0


def test_a_strategy_that_needs_parameter_names_refuses_a_run_without_them():
    class Named(Tiny):
        name = "named"
        needs_parameter_names = True

    with pytest.raises(ConfigError, match=r"^named needs the model's parameter names; none were given$"):
        Named(TinySettings(), context())
    assert Named(TinySettings(), context(parameter_names=("w",))).context.parameter_names == ("w",)


def test_settings_type_is_the_declared_settings_class_and_refuses_another_type():
    class Misdeclared(Tiny):
        settings: int  # type: ignore[assignment]

    assert Tiny.settings_type() is TinySettings
    with pytest.raises(AssertionError):
        Misdeclared.settings_type()


def test_summary_names_the_class_its_rounds_and_its_failure_policy(caplog):
    caplog.set_level(logging.INFO, logger="strategies.base")
    tiny(4, skip_failed=True).summary()
    assert [r.getMessage() for r in caplog.records if r.name == "strategies.base"] == [
        "Tiny: 4 rounds, skip_failed=True"]


def test_a_strategy_of_one_run_refuses_to_inherit_another_runs_state():
    with pytest.raises(NotImplementedError, match=r"^Tiny does not start from another run$"):
        tiny().inherit({"best": 1.0})


def test_restore_gives_back_every_attribute_of_the_state():
    """``state()`` holds every attribute but the transient ones; a fresh strategy restored from it
    holds the same values, and keeps its own settings and run log."""
    old = tiny(3)
    old.aggregated, old.best = [1, 2], 0.75
    state = old.state()
    assert state == {"aggregated": [1, 2], "best": 0.75}
    new = tiny(3)
    log = new.log
    new.restore(state)
    assert new.aggregated == [1, 2] and new.best == 0.75 and new.state() == state and new.log is log


def test_restore_refuses_a_state_this_version_does_not_have_naming_it():
    new = tiny(3)
    with pytest.raises(RuntimeError) as refused:
        new.restore({"best": 0.5, "zeta": 1, "alpha": 2})
    assert str(refused.value) == ("the checkpoint holds Tiny state ['alpha', 'zeta'] that this version of the "
                                  "strategy does not have; resume with the version that wrote it")
    assert new.best == 0.0, "nothing is restored from a refused state"


def test_restore_refuses_a_state_without_what_this_version_keeps_naming_it():
    """A checkpoint of an older version, without state this version learns, would leave that state at
    its fresh value in the middle of a run: refused, naming it."""
    new = tiny(3)
    with pytest.raises(RuntimeError) as refused:
        new.restore({"best": 0.5})
    assert str(refused.value) == ("the checkpoint lacks Tiny state ['aggregated'] that this version of the "
                                  "strategy keeps; resume with the version that wrote it")
    assert new.best == 0.0, "nothing is restored from a refused state"


class Sized(Tiny):
    """Tiny with ``best`` sized by the budget, so a longer run extending a shorter one keeps its own."""

    budget_sized = frozenset({"best"})


def test_extend_takes_every_state_but_what_the_budget_sizes():
    shorter = Sized(TinySettings(rounds=3), context())
    shorter.aggregated, shorter.best = [1, 2], 0.75
    longer = Sized(TinySettings(rounds=6), context())
    longer.best = 0.25
    longer.extend(shorter.state())
    assert (longer.aggregated, longer.best) == ([1, 2], 0.25)


def test_run_log_keeps_each_rounds_train_loss_and_observer_scores():
    log = RunLog()
    assert (log.completed, log.current, log.comm_cost) == (0, 0, 0)
    log.observer = lambda info, new: MetricRecord({"accuracy": 0.5}) if info.round == 2 else None
    first, second = arrays(1.0), arrays(2.0)
    log.record(RoundInfo(1, "s", [0, 2], 2, 0.25), first)
    log.record(RoundInfo(2, "s", [1], 3, None), second)
    assert [info.round for info in log.rounds] == [1, 2] and log.comm_cost == 3
    assert log.result.arrays is second
    assert log.result.train_metrics_clientapp == {1: MetricRecord({"train-loss": 0.25})}
    assert log.result.evaluate_metrics_serverapp == {2: MetricRecord({"accuracy": 0.5})}


def test_run_log_state_holds_its_rounds_and_metrics_and_restores_them():
    log = RunLog()
    rounds = [RoundInfo(1, "s", [0], 1, 0.5), RoundInfo(2, "s", [1], 2, None)]
    for info in rounds:
        log.record(info, arrays(float(info.round)))
    log.completed = 2
    log.answered = {0: 1, 1: 2}
    log.result.evaluate_metrics_serverapp[2] = MetricRecord({"accuracy": 0.5})
    state = log.state()
    assert state == {"rounds": rounds, "completed": 2, "answered": {0: 1, 1: 2},
                     "train_metrics": {1: MetricRecord({"train-loss": 0.5})},
                     "evaluate_metrics": {2: MetricRecord({"accuracy": 0.5})}}
    again = RunLog()
    again.restore(state)
    assert again.rounds == rounds and (again.completed, again.current, again.comm_cost) == (2, 2, 2)
    assert again.answered == {0: 1, 1: 2}
    assert again.result.train_metrics_clientapp == {1: MetricRecord({"train-loss": 0.5})}
    assert again.result.evaluate_metrics_serverapp == {2: MetricRecord({"accuracy": 0.5})}
