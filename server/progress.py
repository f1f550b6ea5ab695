"""What a run prints: a header saying what runs and where it writes, then one progress line per round
(stage, accuracy, participation, elapsed time and ETA)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

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


class Progress:
    """Prints a line per finished round (to stdout by default, flushed so logs stream live)."""

    def __init__(self, total_rounds: int, stream: TextIO | None = None) -> None:
        self.total = total_rounds
        self.stream = stream or sys.stdout

    def line(self, row: dict[str, Any]) -> str:
        """The progress line of a results row: round, stage, test scores, clients, cost, elapsed time and ETA."""
        done = row["round"]
        eta = row["elapsed_s"] / done * (self.total - done) if done else 0.0
        acc = "  -   " if row["test_acc"] is None else f"{row['test_acc']:.4f}"
        loss = "  -   " if row["test_loss"] is None else f"{row['test_loss']:.4f}"
        return (f"[round {done:>4}/{self.total}] {row['stage']:<9} test_acc {acc}  test_loss {loss}  "
                f"n_clients {len(row['clients']):>3}  comm {row['comm_cost']:>6}  "
                f"elapsed {_clock(row['elapsed_s'])}  ETA {_clock(eta)}")

    def update(self, row: dict[str, Any]) -> None:
        """Print the line of a finished round's results row."""
        print(self.line(row), file=self.stream, flush=True)
