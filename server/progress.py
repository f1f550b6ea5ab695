"""What a run prints: a header saying what runs and where it writes, then one progress line per round
(stage, accuracy, participation, elapsed time and ETA)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from common.text import counted

if TYPE_CHECKING:
    from data.scene import Component
    from settings.run import RunSettings


def _component(component: Component) -> str:
    params = ", ".join(f"{key}={value}" for key, value in sorted(component.params.items()) if value is not None)
    return f"{component.name} ({params})" if params else component.name


def header(settings: RunSettings, strategy: str) -> str:
    """``[run] fedcorr on fashion_mnist: 100 clients, partition iid, noise fedcorr (...), seed 1 -> <out_dir>``."""
    scene = settings.scene
    return (f"[run] {strategy} on {scene.dataset.name}: {counted(settings.num_clients, 'client')}, partition "
            f"{_component(scene.partition)}, noise {_component(scene.noise)}, seed {settings.seed} -> "
            f"{settings.out_dir}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def closing_lines(payload: dict[str, Any]) -> str:
    """The closing table of a results payload: rounds, best/final/last-10 accuracy, cost, wall time, and
    where results.json is."""
    summary, config = payload["summary"], payload["config"]

    def pct(value: float | None) -> str:
        return "   -  " if value is None else f"{100 * value:6.2f}"

    return "\n".join([
        f"{'strategy':<10} {'rounds':>6} {'best %':>7} {'final %':>7} {'last10 %':>8} {'comm':>6} {'wall s':>7}",
        f"{config['strategy']['name']:<10} {len(payload['rounds']):>6} {pct(summary['best_acc']):>7} "
        f"{pct(summary['final_acc']):>7} {pct(summary['last10_mean_acc']):>8} {summary['comm_cost']:>6} "
        f"{summary['wall_s']:>7.1f}",
        f"results: {config['out_dir']}/results.json",
    ])


class Schedule(Protocol):
    """The rounds a run plans: how many, where its stages end and which ones are evaluated
    (``server.run.EvaluationSchedule``)."""

    @property
    def last(self) -> int:
        """The last round."""

    @property
    def stage_ends(self) -> frozenset[int]:
        """The rounds after which a stage ends."""

    def due(self, server_round: int) -> bool:
        """Whether the global model after ``server_round`` is evaluated."""


@dataclass
class _Cost:
    """Training seconds and client updates measured in one stage."""

    seconds: float = 0.0
    updates: int = 0


class Progress:
    """Prints a line per finished round (to stdout by default, flushed so logs stream live).

    The ETA adds up what the rounds left will cost: each round's planned client updates
    (``planned_clients``) at the training seconds per update measured in its stage, or over every
    stage so far when its stage has not started, plus the mean seconds of an evaluation for each round
    ``schedule`` evaluates. A method whose stages differ in size (FedCorr trains one client per round
    in stage 1, ten in stage 3) so gets an ETA for the stages to come, not the mean of the rounds so far.
    """

    def __init__(self, schedule: Schedule, planned_clients: Callable[[int], int], stream: TextIO | None = None) -> None:
        self.schedule = schedule
        self.total = schedule.last
        self.planned_clients = planned_clients
        self.stream = stream or sys.stdout
        self.training: dict[int, _Cost] = {}
        self.evaluations: list[float] = []
        self.elapsed: float | None = None

    def stage(self, server_round: int) -> int:
        """The index of the stage ``server_round`` is in (0 for the first)."""
        return sum(1 for end in self.schedule.stage_ends if end < server_round)

    def measure(self, row: dict[str, Any], eval_s: float | None) -> None:
        """Take in the cost of a finished round: its time (minus the evaluation's ``eval_s``) per client
        update, in its stage. An attempt's first round is not measured: its time holds the start-up."""
        if eval_s is not None:
            self.evaluations.append(eval_s)
        if self.elapsed is not None and row["clients"]:
            cost = self.training.setdefault(self.stage(row["round"]), _Cost())
            cost.seconds += max(row["elapsed_s"] - self.elapsed - (eval_s or 0.0), 0.0)
            cost.updates += len(row["clients"])
        self.elapsed = row["elapsed_s"]

    def eta(self, row: dict[str, Any]) -> float | None:
        """Seconds the rounds after ``row``'s will take; None before any round was measured."""
        done = row["round"]
        seconds = sum(cost.seconds for cost in self.training.values())
        updates = sum(cost.updates for cost in self.training.values())
        if not updates:
            return None
        evaluation = sum(self.evaluations) / len(self.evaluations) if self.evaluations else 0.0
        left = 0.0
        for server_round in range(done + 1, self.total + 1):
            cost = self.training.get(self.stage(server_round))
            per_update = cost.seconds / cost.updates if cost is not None else seconds / updates
            left += per_update * self.planned_clients(server_round)
            if self.schedule.due(server_round):
                left += evaluation
        return left

    def line(self, row: dict[str, Any]) -> str:
        """The progress line of a results row: round, stage, test scores, clients, cost, elapsed time and ETA."""
        acc = "  -   " if row["test_acc"] is None else f"{row['test_acc']:.4f}"
        loss = "  -   " if row["test_loss"] is None else f"{row['test_loss']:.4f}"
        eta = self.eta(row)
        return (f"[round {row['round']:>4}/{self.total}] {row['stage']:<9} test_acc {acc}  test_loss {loss}  "
                f"n_clients {len(row['clients']):>3}  comm {row['comm_cost']:>6}  "
                f"elapsed {_clock(row['elapsed_s'])}  ETA {'-' if eta is None else _clock(eta)}")

    def update(self, row: dict[str, Any], eval_s: float | None = None) -> None:
        """Measure a finished round (its evaluation took ``eval_s``, None if none) and print its line."""
        self.measure(row, eval_s)
        print(self.line(row), file=self.stream, flush=True)
