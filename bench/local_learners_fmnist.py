"""FedLSR's Table 3 on Fashion-MNIST, with LeNet-5: FedAvg with each local learner, and FedCorr.

    .venv/bin/python bench/local_learners_fmnist.py [--cells sym0.3 ...] [--seeds 1] [--more-seeds 2 3]
        [--columns fedavg mixup sce coteaching lsr fedcorr] [--lr 0.03] [--reuse | --report] [-- Hydra overrides ...]
    .venv/bin/python bench/local_learners_fmnist.py --lr-sweep 0.01 0.03 0.1 0.15 [--reuse]

The paper's protocol (experiment=fedlsr_fmnist: 100 IID clients, 5 per round, 100 rounds, E = 5,
B = 60, SGD momentum 0.9, weight decay 1e-4, global class-balanced noise) with LeNet-5 in place of the
9-layer CNN, whose ~3.6 GFLOP per sample per step is beyond 2 CPU cores. The paper's lr 0.15 is the
9-layer CNN's; LeNet-5's lr is chosen once on clean data for FedAvg (``--lr-sweep``), not per method.

Columns, all at the same communication cost (500 client participations):
- fedavg, mixup, sce, coteaching, lsr: FedAvg with that learner (``strategy.train.learner``);
  LSR's gamma per cell from the paper's Table 2 (t_w = 20), Co-teaching's forget rate = the cell's
  noise rate (Co-teaching assumes it is known), SCE alpha 0.1, beta 1.
- fedcorr: FedCorr with comm_budget=500 (T1 = 2 iterations of all 100 clients, T2 = 20 rounds of 5,
  stage 3 the rest), 5 clients per round, the same local SGD.

Cells: sym<eps> (noise=symmetric) and pair<eps> (noise=pairflip). Prints best / last-10-mean test
accuracy per column (the paper's metric is the last-10 mean) beside the paper's Table 3 (9-layer CNN),
the LSR - FedAvg margin ours vs the paper's, and how far FedAvg falls from its best.
Runs: outputs/bench-learners/<cell>/seed<seed>/<column>/ (the sweep: outputs/bench-learners/clean/lr<lr>/).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from runs import (
    ConfigError,
    add_table_arguments,
    check_all,
    finished,
    launcher_from,
    main_with_clear_errors,
    run_plan,
    spread,
)

# Imported after runs, which puts the project root ahead of bench/ (whose data.py is not our package).
from launch.jobs import Launcher  # noqa: E402

COLUMNS = ("fedavg", "mixup", "sce", "coteaching", "lsr", "fedcorr")
CELLS = ("sym0.3", "sym0.5", "sym0.7", "pair0.2", "pair0.4")
BUDGET = 500  # 100 rounds x 5 clients
# LeNet-5's learning rate, chosen by --lr-sweep on clean data for FedAvg (docs/results.md).
LENET_LR = 0.03
# FedLSR Table 2, Fashion-MNIST: gamma per noise cell.
GAMMA = {"sym0.3": 0.15, "sym0.4": 0.20, "sym0.5": 0.25, "sym0.6": 0.30, "sym0.7": 0.60,
         "pair0.2": 0.40, "pair0.3": 0.60, "pair0.4": 1.00}
# FedLSR Table 3, Fashion-MNIST (9-layer CNN, last-10-round mean test accuracy %).
PAPER_TABLE_3 = {
    "fedavg": {"sym0.3": 80.02, "sym0.4": 72.75, "sym0.5": 62.29, "sym0.6": 49.22, "sym0.7": 35.87,
               "pair0.2": 86.44, "pair0.3": 77.38, "pair0.4": 63.05},
    "sce": {"sym0.3": 88.86, "sym0.4": 85.96, "sym0.5": 80.32, "sym0.6": 69.87, "sym0.7": 49.34,
            "pair0.2": 89.99, "pair0.3": 84.51, "pair0.4": 68.44},
    "coteaching": {"sym0.3": 89.22, "sym0.4": 88.11, "sym0.5": 86.82, "sym0.6": 84.43, "sym0.7": 81.03,
                   "pair0.2": 90.37, "pair0.3": 87.77, "pair0.4": 83.03},
    "lsr": {"sym0.3": 90.42, "sym0.4": 89.73, "sym0.5": 88.67, "sym0.6": 87.00, "sym0.7": 82.72,
            "pair0.2": 90.84, "pair0.3": 90.27, "pair0.4": 88.34},
}
_CELL = re.compile(r"(sym|pair)(0\.[0-9]+)$")


def parse_cell(cell: str) -> tuple[str, str]:
    """``sym0.5`` -> ("symmetric", "0.5"); a cell outside Table 2's is an error."""
    match = _CELL.match(cell)
    if not match or cell not in GAMMA:
        raise ConfigError(f"--cells {cell} is invalid: allowed are {', '.join(GAMMA)}")
    return ("symmetric" if match.group(1) == "sym" else "pairflip"), match.group(2)


def protocol(lr: float, seed: int, extra: list[str]) -> list[str]:
    """The overrides every run of a cell shares: the paper's protocol with LeNet-5 at ``lr``."""
    return ["experiment=fedlsr_fmnist", "model=lenet5", *extra, f"seed={seed}", f"strategy.train.lr={lr}"]


def column_overrides(column: str, cell: str) -> list[str]:
    """The strategy overrides of a column in a cell."""
    _, eps = parse_cell(cell)
    if column == "fedcorr":
        return ["strategy=fedcorr", f"comm_budget={BUDGET}", "strategy.frac2=0.05", "strategy.t1=2",
                "strategy.t2=20", "strategy.train.momentum=0.9", "strategy.train.weight_decay=1e-4",
                "strategy.train.epochs=5", "strategy.train.batch_size=60"]
    learner = "ce" if column == "fedavg" else column
    chosen = ["strategy=fedavg", f"strategy.train.learner={learner}"]
    if column == "lsr":
        chosen.append(f"strategy.train.lsr.gamma={GAMMA[cell]}")
    if column == "coteaching":
        chosen.append(f"strategy.train.coteaching.forget_rate={eps}")
    return chosen


def cell_run(cell: str, column: str, seed: int, lr: float, extra: list[str]) -> list[str]:
    """All overrides of one run."""
    kind, eps = parse_cell(cell)
    return [*protocol(lr, seed, extra), f"noise={kind}", f"noise.eps={eps}", *column_overrides(column, cell),
            f"out_dir=outputs/bench-learners/{cell}/seed{seed}/{column}"]


def lr_sweep(rates: list[float], extra: list[str], reuse: bool, launcher: Launcher) -> None:
    """Clean FedAvg at each learning rate: the choice of LeNet-5's lr."""
    runs = {lr: [*protocol(lr, 1, extra), "noise=none", "strategy=fedavg",
                 f"out_dir=outputs/bench-learners/clean/lr{lr}/fedavg"] for lr in rates}
    check_all(list(runs.values()), reuse)
    done = run_plan(runs, list(runs), reuse, launcher=launcher)
    print("\nClean Fashion-MNIST, FedAvg, LeNet-5, the FedLSR protocol (seed 1): the lr choice")
    print(f"{'lr':>6} {'best %':>8} {'final %':>8} {'last-10 %':>10}")
    for lr, payload in done.items():
        s = payload["summary"]
        print(f"{lr:>6} {100 * s['best_acc']:>8.2f} {100 * s['final_acc']:>8.2f} {100 * s['last10_mean_acc']:>10.2f}")


def margin(ours: list[dict[str, Any]], base: list[dict[str, Any]]) -> float:
    """Mean last-10 accuracy of ``ours`` minus ``base``'s, in points (NaN if either has no run)."""
    def mean(payloads: list[dict[str, Any]]) -> float:
        if not payloads:
            return float("nan")
        return 100 * sum(p["summary"]["last10_mean_acc"] for p in payloads) / len(payloads)
    return mean(ours) - mean(base)


def main() -> None:
    """Run (or reuse) the table's runs and print it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=list(CELLS), metavar="CELL")
    parser.add_argument("--columns", nargs="+", choices=COLUMNS, default=list(COLUMNS), metavar="COLUMN")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds of every cell")
    parser.add_argument("--more-seeds", nargs="*", type=int, default=[2, 3],
                        help="further seeds of the sym0.5 cell (the paper's middle column)")
    parser.add_argument("--lr", type=float, default=LENET_LR, help="LeNet-5's local learning rate")
    parser.add_argument("--lr-sweep", nargs="+", type=float, default=None, metavar="LR",
                        help="only run clean FedAvg at these learning rates and print them")
    add_table_arguments(parser)
    args = parser.parse_args()
    launcher = launcher_from(args)
    if not args.lr > 0:
        raise ConfigError(f"--lr {args.lr} is invalid: allowed is a number > 0")
    if args.lr_sweep is not None:
        lr_sweep(args.lr_sweep, args.overrides, args.reuse, launcher)
        return
    for cell in args.cells:
        parse_cell(cell)
    seeds = {cell: sorted(set(args.seeds) | (set(args.more_seeds) if cell == "sym0.5" else set()))
             for cell in args.cells}
    planned = {(cell, column, seed): cell_run(cell, column, seed, args.lr, args.overrides)
               for cell in args.cells for seed in seeds[cell] for column in args.columns}
    check_all(list(planned.values()), args.reuse or args.report)
    # Seed 1 of every cell first, so the table's first row of numbers is complete early.
    order = sorted(planned, key=lambda key: (key[2], args.cells.index(key[0]), args.columns.index(key[1])))
    done = ({key: finished(planned[key]) for key in order} if args.report
            else run_plan(planned, order, args.reuse, launcher=launcher))

    def cell_runs(cell: str, column: str) -> list[dict[str, Any]]:
        """The finished runs of a cell's column (with --report, maybe fewer than its seeds)."""
        return [payload for seed in seeds[cell] if (payload := done[(cell, column, seed)]) is not None]

    print(f"\nFedLSR Table 3 protocol on Fashion-MNIST with LeNet-5 (lr {args.lr}), {BUDGET} client participations "
          "per run; last-10-round mean test accuracy % (best in brackets), mean ± std over the seeds; "
          "paper: 9-layer CNN")
    print(f"{'column':<11} " + " ".join(f"{f'{cell} ({len(seeds[cell])} seeds)':>26}" for cell in args.cells))
    for column in args.columns:
        ours = []
        for cell in args.cells:
            payloads = cell_runs(cell, column)
            last10 = spread([p["summary"]["last10_mean_acc"] for p in payloads], 100)
            best = spread([p["summary"]["best_acc"] for p in payloads], 100, 1)
            ours.append(f"{last10} ({best}) n={len(payloads)}" if payloads else "-")
        print(f"{column:<11} " + " ".join(f"{cell:>26}" for cell in ours))
        if column in PAPER_TABLE_3:
            print(f"{'  paper':<11} " + " ".join(f"{PAPER_TABLE_3[column][cell]:>26.2f}" for cell in args.cells))
    if {"lsr", "fedavg"} <= set(args.columns):
        print(f"\n{'LSR - FedAvg':<13} " + " ".join(f"{cell:>16}" for cell in args.cells))
        print(f"{'  ours':<13} " + " ".join(
            f"{margin(cell_runs(cell, 'lsr'), cell_runs(cell, 'fedavg')):>+16.2f}" for cell in args.cells))
        print(f"{'  paper':<13} " + " ".join(
            f"{PAPER_TABLE_3['lsr'][cell] - PAPER_TABLE_3['fedavg'][cell]:>+16.2f}" for cell in args.cells))
    if "fedavg" in args.columns:
        print(f"\n{'FedAvg: best - last-10 (points)':<32} " + " ".join(
            f"{cell}: {fall_from_best(cell_runs(cell, 'fedavg')):.2f}" for cell in args.cells))


def fall_from_best(payloads: list[dict[str, Any]]) -> float:
    """How far FedAvg's last-10 mean sits below its best accuracy, in points (mean over seeds; NaN: none)."""
    if not payloads:
        return float("nan")
    return 100 * sum(p["summary"]["best_acc"] - p["summary"]["last10_mean_acc"] for p in payloads) / len(payloads)


if __name__ == "__main__":
    main_with_clear_errors(main)
