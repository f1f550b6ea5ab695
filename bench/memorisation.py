"""When a run starts to memorise its noisy labels: its best and last-10-round mean test accuracy as if
it had stopped at each budget.

    .venv/bin/python bench/memorisation.py RUN_DIR [RUN_DIR ...] [--step 500] [--drop 2.0]

Reads each run's rounds.csv (a finished run, or one still going: its rounds so far) and prints, per
budget B of client participations (every ``--step``, and the run's last): the round that reaches B,
the best test accuracy before its last 10 evaluated rounds (and that best's round), the mean of those
last 10, and the drop: that best minus the last-10 mean, in points. A run still learning has a
last-10 mean at or above its earlier best (drop <= 0); one that memorises falls under it. The run's
memorisation budget is the first B from which the drop is at least ``--drop`` points at every later
budget of the run: where a stopped run's last-10 accuracy has clearly fallen from its best and stays
fallen. With several runs (seeds), the mean drop per budget
and the budget from which the mean stays fallen come last. Rounds without a test accuracy (not
evaluated) are skipped.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

from runs import ConfigError, main_with_clear_errors

LAST = 10


@dataclass(frozen=True)
class Point:
    """A run stopped at ``budget`` participations (after round ``round``): ``best`` (at ``best_round``)
    before its last 10 evaluated rounds, and their mean ``last10``."""

    budget: int
    round: int
    best: float
    best_round: int
    last10: float

    @property
    def drop(self) -> float:
        """Points the last-10 mean lies under the best before it."""
        return 100 * (self.best - self.last10)


def read_rounds(run_dir: Path) -> list[tuple[int, int, float]]:
    """(round, comm_cost, test accuracy) of each evaluated round of a run, in order."""
    path = run_dir / "rounds.csv"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is invalid: allowed is a run folder with a rounds.csv (none at {path})")
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("test_acc") not in (None, ""):
                accuracy = float(row["test_acc"])
                if not math.isnan(accuracy):
                    rows.append((int(row["round"]), int(row["comm_cost"]), accuracy))
    return rows


def points(rows: list[tuple[int, int, float]], step: int) -> list[Point]:
    """The run stopped at every multiple of ``step`` participations it reached, and at its end (from
    the 11th evaluated round on, so that some best lies before the last 10)."""
    marks = sorted({*range(step, rows[-1][1] + 1, step), rows[-1][1]}) if rows else []
    found = []
    for mark in marks:
        upto = [row for row in rows if row[1] <= mark]
        if len(upto) <= LAST:
            continue
        best = max(upto[:-LAST], key=lambda row: row[2])
        last = [row[2] for row in upto[-LAST:]]
        found.append(Point(mark, upto[-1][0], best[2], best[0], sum(last) / LAST))
    return found


def fallen_from(drops: list[tuple[int, float]], threshold: float) -> int | None:
    """The first budget from which every drop (budget, points) is >= ``threshold``; None if none is."""
    first = None
    for budget, drop in drops:
        if drop >= threshold:
            first = budget if first is None else first
        else:
            first = None
    return first


def main() -> None:
    """Print each run's budgets and its memorisation budget, then the mean over the runs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--step", type=int, default=500, help="budgets every this many participations")
    parser.add_argument("--drop", type=float, default=2.0, help="points under the best that count as fallen")
    args = parser.parse_args()
    if args.step < 1:
        raise ConfigError(f"--step {args.step} is invalid: allowed is an integer >= 1")
    if not args.drop > 0:
        raise ConfigError(f"--drop {args.drop} is invalid: allowed is a number > 0")
    every = {run: points(read_rounds(run), args.step) for run in args.runs}
    for run, found in every.items():
        print(f"\n{run}")
        print(f"{'budget':>7} {'round':>6} {'best %':>7} {'@round':>7} {'last-10 %':>10} {'drop':>6}")
        for point in found:
            print(f"{point.budget:>7} {point.round:>6} {100 * point.best:>7.2f} {point.best_round:>7} "
                  f"{100 * point.last10:>10.2f} {point.drop:>6.2f}")
        budget = fallen_from([(point.budget, point.drop) for point in found], args.drop)
        print(f"memorisation budget (drop >= {args.drop} points from there on): {budget or 'not reached'}")
    if len(every) > 1:
        shared = set.intersection(*({point.budget for point in found} for found in every.values()))
        mean = [(budget, sum(point.drop for found in every.values() for point in found if point.budget == budget)
                 / len(every)) for budget in sorted(shared)]
        print(f"\nmean drop over the {len(every)} runs: "
              + ", ".join(f"{budget} {drop:.2f}" for budget, drop in mean))
        budget = fallen_from(mean, args.drop)
        print(f"memorisation budget of the mean (drop >= {args.drop} points from there on): {budget or 'not reached'}")


if __name__ == "__main__":
    main_with_clear_errors(main)
