"""The round-based strategies at one communication budget, alone and as FedCorr's stage 3 (FedCorr
Fig. 4 on Fashion-MNIST, extended to every registered round-based strategy).

    .venv/bin/python bench/strategies_fmnist.py [--rhos 0.4 0.6 0.8] [--tau 0.5] [--budget 600]
                                                [--experiment fmnist] [--methods NAME ... | --figure4]
                                                [--reuse | --report] [--outputs outputs]
                                                [-- Hydra overrides]

For every rho: every round-based strategy of the registry standalone (FedAvg, FedProx, FedDyn,
FedMedian, PoC, FedLSR, and any added since), and FedCorr with each of them but FedAvg as its stage 3
(FedCorr with FedAvg is FedCorr itself), each spending exactly ``--budget`` client participations
(``comm_budget``; FedCorr's stage 3 gets what its stages 1-2 leave). ``--figure4``: only the paper's
Fig. 4 columns. Defaults: experiment=fmnist (100 clients IID,
LeNet-5) and the strategies' conf/ settings. Prints best (and final) test accuracy per method and
the share of participations that went to noisy clients (Power-of-Choice favours high loss), and
what FedCorr's stages 1-2 reached (a FedCorr run's best may come from them rather than stage 3); every
run's results.json stays under outputs/bench-strategies/<experiment>-budget<B>/ (``--outputs``: under
another folder than outputs/). --reuse skips runs already finished with the same config and continues a
run stopped mid-run from its latest checkpoint (``resuming <out_dir> from round R``), so a long
benchmark resumes where it stopped; --methods runs (or reports) only some columns, so two processes
can share the table's runs without running one twice.

The FedCorr columns of one rho differ only in stage 3, so they run FedCorr's stages 1-2 once: the
first FedCorr column run does them (FedCorr with FedAvg, the plain FedCorr, is not a column here) and
the others take them over from its stage-2 checkpoint (``strategy.stages12_from``), running only stage
3, with the results a run from round 0 gets; a column whose overrides change stages 1-2 runs its own.
The output ends with the time that saved. Processes split by --methods each run the stages 1-2 of
their own first FedCorr column.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from runs import (
    Ledger,
    add_table_arguments,
    check_all,
    finished,
    launcher_from,
    main_with_clear_errors,
    print_time_saved,
    run_plan,
)

# Imported after runs, which puts the project root ahead of bench/ (whose data.py is not our package).
from data.scene import SCENE_FILE, Scene  # noqa: E402

# FedCorr's own stages: every client trains in stage 1, only clean ones in stage 2.
FEDCORR_STAGES = ("preprocess", "finetune")

from strategies.fedcorr import stage3_classes  # noqa: E402

STANDALONE = tuple(stage3_classes())
WITH_FEDCORR = tuple(name for name in STANDALONE if name != "fedavg")
COLUMNS = (*STANDALONE, *(f"fedcorr+{name}" for name in WITH_FEDCORR))
FIGURE4 = ("fedavg", "fedprox", "feddyn", "fedmedian", "poc", "fedcorr+feddyn", "fedcorr+fedmedian", "fedcorr+poc")


def main() -> None:
    """Run (or reuse; with --report only read) the chosen columns' runs for every rho, and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rhos", nargs="+", default=["0.4", "0.6", "0.8"])
    parser.add_argument("--tau", default="0.5")
    parser.add_argument("--budget", type=int, default=600, help="client participations per run")
    parser.add_argument("--experiment", default="fmnist", help="conf/experiment preset (smoke: a quick check)")
    parser.add_argument("--methods", nargs="+", choices=COLUMNS, default=list(COLUMNS), metavar="NAME",
                        help=f"the columns to run or report, of {', '.join(COLUMNS)} (default: all)")
    parser.add_argument("--figure4", action="store_true", help="only the columns of FedCorr's Fig. 4: "
                                                                + ", ".join(FIGURE4))
    add_table_arguments(parser, "bench-strategies")
    args = parser.parse_args()
    launcher = launcher_from(args)
    columns = [name for name in COLUMNS if name in (FIGURE4 if args.figure4 else args.methods)]
    plan = plan_cells(args.rhos, args.tau, args.budget, args.experiment, columns, args.overrides, args.outputs)
    check_all(list(plan.values()), args.reuse or args.report)
    ledger = Ledger()
    payloads = ({cell: finished(overrides) for cell, overrides in plan.items()} if args.report
                else run_plan(plan, list(plan), args.reuse, ledger, launcher))
    table: dict[str, dict[str, dict | None]] = {rho: {} for rho in args.rhos}
    for (rho, column), payload in payloads.items():
        table[rho][column] = payload

    print(f"\nexperiment={args.experiment}, tau = {args.tau}, overrides {args.overrides}; best/final test "
          f"accuracy (%) at comm_budget={args.budget} client participations")
    print_table(table, columns, lambda run: f"{100 * run['summary']['best_acc']:.2f}/"
                                            f"{100 * run['summary']['final_acc']:.2f}")
    spent = sorted({row[c]["summary"]["comm_cost"] for row in table.values() for c in columns if row[c]})
    print(f"participations spent per run: {spent} (FedCorr spends less when its clean set is smaller than a "
          "finetuning round)")
    print("\nshare of participations (%) that went to noisy clients (FedCorr: stage 3 only)")
    print_table(table, columns, lambda run: f"{100 * noisy_share(run):.1f}")
    print_shared_stages(table)
    print_time_saved(ledger)


def plan_cells(rhos: list[str], tau: str, budget: int, experiment: str, columns: list[str],
               overrides: list[str], outputs: str = "outputs") -> dict[tuple[str, str], list[str]]:
    """The Hydra overrides of every (rho, column) cell; each cell writes to its own out_dir under ``outputs``."""
    base = [f"experiment={experiment}", f"comm_budget={budget}", *overrides]
    plan: dict[tuple[str, str], list[str]] = {}
    for rho in rhos:
        scene = [*base, "noise=fedcorr", f"noise.rho={rho}", f"noise.tau={tau}"]
        tag = f"{outputs}/bench-strategies/{experiment}-budget{budget}/rho{rho}-tau{tau}"
        for column in columns:
            stage3 = column.removeprefix("fedcorr+")
            strategy = [f"strategy={column}"] if stage3 == column else ["strategy=fedcorr", f"strategy.stage3={stage3}"]
            plan[rho, column] = [*scene, *strategy, f"out_dir={tag}/{column}"]
    return plan


def print_table(table: dict[str, dict[str, dict | None]], columns: list[str], cell: Callable[[dict], str]) -> None:
    """One row per rho, one column per method; '-' where the run has not finished."""
    print(f"{'rho':<5}" + "".join(f"{name:>19}" for name in columns))
    for rho, row in table.items():
        print(f"{rho:<5}" + "".join(f"{'-' if row[c] is None else cell(row[c]):>19}" for c in columns))


def print_shared_stages(table: dict[str, dict[str, dict | None]]) -> None:
    """FedCorr's columns differ only in stage 3 and share stages 1-2 (run once, see ``run_plan``), so
    their best accuracy may come from them; print what those stages reached (one value per rho when the
    runs agree, as they must)."""
    lines = []
    for rho, row in table.items():
        reached = {stages_best_and_last(run) for column, run in row.items() if column.startswith("fedcorr+") and run}
        if reached:
            values = ", ".join(f"best {100 * best:.2f}, last {100 * last:.2f}" for best, last in sorted(reached))
            lines.append(f"{rho:<5}{values}" + ("  (the runs disagree)" if len(reached) > 1 else ""))
    if lines:
        print("\nFedCorr's stages 1-2, shared by its columns: test accuracy (%) over them and at their end")
        print("\n".join(lines))


def stages_best_and_last(payload: dict) -> tuple[float, float]:
    """A FedCorr run's best and last test accuracy over its stages 1-2."""
    accs = [entry["test_acc"] for entry in payload["rounds"]
            if entry["stage"] in FEDCORR_STAGES and entry["test_acc"] is not None]
    return max(accs), accs[-1]


def noisy_share(payload: dict) -> float:
    """The share of a run's training participations (stage 3 for FedCorr) by clients the scene made
    noisy: Power-of-Choice asks for high-loss clients, and under label noise those are the noisy ones."""
    scene = Scene.load(Path(payload["config"]["out_dir"]) / SCENE_FILE)
    chosen = [client for entry in payload["rounds"] if entry["stage"] not in FEDCORR_STAGES
              for client in entry["clients"]]
    return float(np.mean(scene.noise_level[chosen] > 0))


if __name__ == "__main__":
    main_with_clear_errors(main)
