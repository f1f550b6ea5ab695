"""The field table on Fashion-MNIST: FedAvg, FedProx, FedCorr, FedLSR, FedNoRo, FedDiv and FedES at
one communication cost, under FedCorr's noise (IID and non-IID) and FedES's noise.

    .venv/bin/python bench/field_fmnist.py [--cells corr-iid ...] [--columns fedavg fedcorr+poc ...] [--seeds 1]
        [--more-seeds 2 3] [--budget 600 [3000 ...]] [--experiment fmnist] [--reuse | --report] [--outputs outputs]
        [--markdown] [--tables rows ranks course recall] [-- Hydra overrides]

Cells (100 clients, LeNet-5, experiment=fmnist):
- corr-iid: FedCorr's noise (rho, tau) = (0.6, 0.5), IID; seeds 1-3 (``--more-seeds``).
- corr-noniid: the same noise, FedCorr's non-IID partition (p, alpha_Dir) = (0.7, 10).
- es-sym0.3, es-sym0.5, es-pair0.3, es-pair0.5: FedES's noise, every client's rate ~ N(mu, 0.2)
  clipped to [0, 1], symmetric or pair-flip (y -> y+1, every class to its index neighbour; FedES's own
  asymmetric noise is a class map, whose Fashion-MNIST analogue is noise.kind=fmnist_asym:
  docs/fedes.md), IID.
Every method spends ``--budget`` client participations (``comm_budget``) with its conf/ defaults:
FedAvg, FedProx, FedLSR and FedNoRo 60 rounds of 10 clients; FedCorr T1 = 2, T2 = 20 and stage 3 the
rest; FedDiv 2 warm-up iterations and 40 rounds, as its paper (feddiv) and with every switch at its
released code's choice (feddiv_code, conf/strategy/feddiv_code.yaml); FedES s1 = 10 rounds, one
all-client estimation round, then SeGD rounds. Prints best / final / last-10-round mean test accuracy per cell and each
method's detection F1 against the ground truth (FedES: its quality estimate's MSE instead), how many
of its planned runs have finished, how far it fell from its best by the end (best - last-10) and its
last-10 minus FedAvg's on the same seed (when FedAvg is a column), then
the papers' CIFAR-10 numbers for the same kind of cell; under the rows, the leader by last-10 on the
seeds every method finished and its paired margin over the next method; per paper its order of the methods it
reports beside ours of the same methods (by best and by last-10 accuracy), at a budget over 600 the
course of each method (its mean test accuracy over the last 100 participations before 600, 1,000, ...
participations and the budget), and each method's final recall per class with its weakest class (from
the final confusion matrix); ``--tables`` picks which of those four each cell prints, and
``--markdown`` prints them in Markdown for docs/results.md. ``--budget`` sets the
cost; 600 is the table of docs/results.md, a longer one is the papers' regime where FedAvg memorises.
Several budgets (``--budget 600 3000``) run in one plan and print a table each, the smaller first: a
longer run waits for the same run at the smallest budget and continues it (below; a FedCorr column
that took stages 1-2 over takes them from the plain FedCorr run instead, or from the shorter run
that one continued, at once when that one is on disk), and with ``--jobs N`` it starts as soon as that
one has ended, while the others keep the N places busy. Runs:
outputs/bench-field/<experiment>-budget<B>/<cell>/seed<seed>/<column>/ (``--outputs``: another folder
than outputs/).

``--columns`` also takes FedCorr with another stage 3, ``fedcorr+<strategy>`` (fedcorr+feddyn,
fedcorr+poc, ...; not in the default table). The FedCorr columns of one cell and seed run FedCorr's
stages 1-2 once: the plain fedcorr column first (it keeps its stage-2 checkpoint; without it the first
FedCorr column), then every other one takes them over from it (``strategy.stages12_from``) and runs only
its stage 3, with the same results as from round 0; overrides that change stages 1-2 for one column
make it run its own. The end of the output says the time that saved. --reuse also continues a run
stopped mid-run from its latest checkpoint (``resuming <out_dir> from round R``) instead of round 0.
A run whose strategy's early rounds do not depend on the budget (all but FedNoRo's) and whose same run
at a smaller budget has finished under the same ``--outputs`` continues from that run's end
(``extend_from``) instead of round 0, with the same results: the 3,000-participation field does not
compute its first 600 participations again (the end of the output says the time that saved).
Where such a run ran from round 0 instead (its shorter run came back from docs/records, which keep no
checkpoints), the output ends saying whether it repeats the shorter run's rounds in every figure but
the time: the two are the same run made twice, in separate processes, often on separate machines.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from runs import (
    ConfigError,
    Ledger,
    add_table_arguments,
    budget_free,
    check_all,
    computed_afresh,
    finished,
    first_unrepeated,
    known_mean,
    launcher_from,
    main_with_clear_errors,
    print_time_saved,
    run_plan,
    spread,
)

# Imported after runs, which puts the project root ahead of bench/ (whose data.py is not our package).
from data.sources.fashion_mnist import CLASSES as FASHION_MNIST_CLASSES  # noqa: E402
from launch.jobs import Launcher  # noqa: E402
from reports.tables import fixed_width_lines, markdown_lines  # noqa: E402
from strategies.fedcorr import stage3_classes  # noqa: E402

COLUMNS = ("fedavg", "fedprox", "fedcorr", "fedlsr", "fednoro", "feddiv", "feddiv_code", "fedes")
# FedCorr with another stage 3: columns on request, sharing the fedcorr column's stages 1-2.
FEDCORR_WITH = tuple(f"fedcorr+{name}" for name in stage3_classes() if name != "fedavg")
CHOICES = (*COLUMNS, *FEDCORR_WITH)
CELLS = {
    "corr-iid": ["noise=fedcorr", "noise.rho=0.6", "noise.tau=0.5", "partition=iid"],
    "corr-noniid": ["noise=fedcorr", "noise.rho=0.6", "noise.tau=0.5", "partition=fedcorr_noniid",
                    "partition.p=0.7", "partition.alpha=10"],
    "es-sym0.3": ["noise=gaussian", "noise.mean=0.3", "noise.kind=symmetric", "partition=iid"],
    "es-sym0.5": ["noise=gaussian", "noise.mean=0.5", "noise.kind=symmetric", "partition=iid"],
    "es-pair0.3": ["noise=gaussian", "noise.mean=0.3", "noise.kind=pairflip", "partition=iid"],
    "es-pair0.5": ["noise=gaussian", "noise.mean=0.5", "noise.kind=pairflip", "partition=iid"],
}
# The cell that gets more seeds (the FedCorr/FedDiv papers' headline setting).
SEEDED_CELL = "corr-iid"
# Test accuracy (%) on CIFAR-10 in each paper, for the kind of cell (not the same data or network), by
# the paper's table: FedCorr Tables 2 and 4 and FedDiv Tables 1-2 (best accuracy; IID and non-IID
# (0.7, 10) at (0.6, 0.5); FedDiv copies FedAvg and FedCorr from FedCorr), FedES Table 1 (IID,
# symmetric and asymmetric, mu 0.3 / 0.5).
PAPERS = {
    "corr-iid": {"FedCorr Table 2": {"fedavg": 81.22, "fedprox": 85.25, "fedcorr": 92.50},
                 "FedDiv Table 1": {"fedavg": 81.22, "fedcorr": 92.50, "feddiv": 93.41}},
    "corr-noniid": {"FedCorr Table 4": {"fedavg": 78.88, "fedprox": 83.32, "fedcorr": 90.52},
                    "FedDiv Table 2": {"fedavg": 78.88, "fedcorr": 90.52, "feddiv": 93.18}},
    "es-sym0.3": {"FedES Table 1": {"fedavg": 78.32, "fednoro": 87.55, "fedes": 93.09}},
    "es-sym0.5": {"FedES Table 1": {"fedavg": 55.59, "fednoro": 71.00, "fedes": 85.40}},
    "es-pair0.3": {"FedES Table 1": {"fedavg": 81.62, "fednoro": 83.79, "fedes": 90.79}},
    "es-pair0.5": {"FedES Table 1": {"fedavg": 50.28, "fednoro": 48.16, "fedes": 60.34}},
}


def cell_run(cell: str, column: str, seed: int, budget: int, experiment: str, extra: list[str],
             outputs: str = "outputs") -> list[str]:
    """All overrides of one run (``fedcorr+<name>``: FedCorr with stage 3 ``name``)."""
    method, _, stage3 = column.partition("+")
    strategy = [f"strategy={method}", *([f"strategy.stage3={stage3}"] if stage3 else [])]
    return [f"experiment={experiment}", *CELLS[cell], *strategy, f"comm_budget={budget}", *extra,
            f"seed={seed}", f"out_dir={outputs}/bench-field/{experiment}-budget{budget}/{cell}/seed{seed}/{column}"]


def shorter_budgets(outputs: str, experiment: str, budget: int) -> list[int]:
    """The budgets under ``budget`` that ``outputs`` holds field runs of, the largest first."""
    found = (re.fullmatch(rf"{re.escape(experiment)}-budget(\d+)", path.name)
             for path in (Path(outputs) / "bench-field").glob(f"{experiment}-budget*"))
    return sorted((int(match[1]) for match in found if match and int(match[1]) < budget), reverse=True)


def result_block(column: str) -> str:
    """The results.json block of a column's method: ``fedcorr+poc`` -> fedcorr, ``feddiv_code`` (a
    variant's conf file, ``<strategy>_<variant>.yaml``) -> feddiv."""
    return column.partition("+")[0].partition("_")[0]


def detection_f1(payload: dict[str, Any] | None, column: str) -> float | None:
    """The F1 of the clients a method treats as noisy against the truly noisy ones (None: no detection)."""
    block = (payload or {}).get(result_block(column)) or {}
    detection = block.get("detection")
    return detection["f1"] if detection else None


def quality_mse(payload: dict[str, Any] | None) -> float | None:
    """FedES's mean squared error of rho_n against the true quality 1 - noise rate (its Table 4)."""
    return ((payload or {}).get("fedes") or {}).get("quality_mse")


def class_recall(payload: dict[str, Any] | None) -> list[float] | None:
    """Per true class, the share of its test images the final model classifies correctly (from the last
    evaluation's ``test_confusion``); None for an unfinished run or one without the matrix."""
    confusion = (payload or {}).get("test_confusion")
    if not confusion:
        return None
    counts = confusion["counts"]
    return [row[k] / max(sum(row), 1) for k, row in enumerate(counts)]


Table = tuple[list[str], list[list[str]]]
"""A table's header and rows, each a list of cells."""


def recall_table(columns: list[str], payloads: dict[str, list[dict[str, Any] | None]]) -> Table | None:
    """The final per-class recall (%, mean ± std over each column's finished runs) of a cell, a class
    per column, and each method's weakest class: where an accuracy's few points are lost. None where
    no finished run has the matrix."""
    recalls = {column: [r for r in map(class_recall, payloads[column]) if r is not None] for column in columns}
    classes = max((len(r[0]) for r in recalls.values() if r), default=0)
    if not classes:
        return None
    fashion = any(p and p["config"]["dataset"]["name"] == "fashion_mnist" for runs in payloads.values() for p in runs)
    names = [name.split("/")[0] for name in FASHION_MNIST_CLASSES] if fashion else [str(k) for k in range(classes)]
    rows = []
    for column in columns:
        if not recalls[column]:
            continue
        per_class = [[run[k] for run in recalls[column]] for k in range(classes)]
        weakest = min(range(classes), key=lambda k: sum(per_class[k]))
        rows.append([column, *(spread(values, 100, 0) for values in per_class), names[weakest]])
    return ["method", *(name[:10] for name in names), "weakest"], rows


# Where the course of a longer run is read: the 600 table's budget, then every 500 participations.
COURSE_POINTS = (600, 1000, 1500, 2000, 2500, 3000)
# Each point's figure is the mean over the last this many participations before it (10 rounds of 10).
COURSE_WINDOW = 100
# Each cell's tables, in the order they print: its rows, the papers' ranks, the course, the recall.
TABLES = ("rows", "ranks", "course", "recall")


def window_mean(payload: dict[str, Any] | None, point: int, window: int = COURSE_WINDOW) -> float | None:
    """Mean test accuracy of a run's evaluated rounds whose communication cost is in (point - window,
    point]; None for an unfinished run or one with no evaluation there."""
    accuracies = [row["test_acc"] for row in (payload or {}).get("rounds", [])
                  if row.get("test_acc") is not None and point - window < row["comm_cost"] <= point]
    return sum(accuracies) / len(accuracies) if accuracies else None


def course_table(columns: list[str], payloads: dict[str, list[dict[str, Any] | None]], budget: int) -> Table | None:
    """The course of a run longer than the first point: per method, mean ± std over its finished runs of
    ``window_mean`` at each of ``COURSE_POINTS`` below the budget and at the budget; whether it keeps
    learning after 600 participations or falls back as it memorises. None for a budget of one point,
    or where no run has finished."""
    points = [point for point in COURSE_POINTS if point < budget] + [budget]
    if len(points) < 2:
        return None
    rows = []
    for column in columns:
        runs = [payload for payload in payloads[column] if payload]
        if runs:
            rows.append([column, *(spread([window_mean(run, point) for run in runs], 100) for point in points)])
    return (["method", *map(str, points)], rows) if rows else None


def made_at(payloads: list[dict[str, Any] | None]) -> str:
    """The commits the finished runs were made at, each with how many runs (a run resumed or extended at
    another commit counts under each of its attempts' commits), and how many came from a checkout with
    uncommitted changes: a table whose runs mix commits says so."""
    commits: dict[str, int] = {}
    dirty = 0
    for payload in filter(None, payloads):
        attempts = [attempt.get("git") or {} for attempt in payload.get("provenance", [])]
        for commit in dict.fromkeys(str(git.get("commit", "unknown"))[:7] for git in attempts):
            commits[commit] = commits.get(commit, 0) + 1
        dirty += any(git.get("dirty") for git in attempts)
    if not commits:
        return "no run has finished"
    made = ", ".join(f"{commit} ({count})" for commit, count in sorted(commits.items(), key=lambda item: -item[1]))
    return f"runs made at commit {made}" + (f"; {dirty} from a checkout with uncommitted changes" if dirty else "")


def summary(payloads: list[dict[str, Any] | None], key: str) -> str:
    """Mean ± std of a summary figure (%) over the finished runs; '-' if none finished."""
    return spread([p["summary"][key] for p in payloads if p], 100)


def forgetting(payloads: list[dict[str, Any] | None]) -> str:
    """Mean ± std of best minus last-10 accuracy (points) over the finished runs: how far a method has
    fallen from its best by the end, the sign of memorised noise; '-' if none finished."""
    return spread([p["summary"]["best_acc"] - p["summary"]["last10_mean_acc"] for p in payloads if p], 100)


def versus(payloads: list[dict[str, Any] | None], baseline: list[dict[str, Any] | None]) -> str:
    """Mean ± std over the seeds where both finished of last-10 accuracy minus the baseline's on the
    same seed (points): paired, so the spread the seed's scene gives both runs cancels; '-' if none."""
    return spread([p["summary"]["last10_mean_acc"] - b["summary"]["last10_mean_acc"]
                   for p, b in zip(payloads, baseline, strict=True) if p and b], 100)


ROW_HEADER = ["method", "runs", "best", "final", "last-10", "best-last10", "vs fedavg", "detect F1",
              "CIFAR-10 paper", "last-10 per seed"]
ROW_WIDTHS = [5, 13, 13, 13, 11, 12, 10, 15, 24]  # of the columns after the method's


def per_seed(payloads: list[dict[str, Any] | None]) -> str:
    """Each planned seed's last-10 accuracy (%), in the seeds' order: '84.20 / - / 84.51'."""
    return " / ".join("-" if p is None else f"{100 * p['summary']['last10_mean_acc']:.2f}" for p in payloads)


def row(column: str, payloads: list[dict[str, Any] | None], paper: float | None,
        baseline: list[dict[str, Any] | None] | None = None) -> list[str]:
    """One method's row of a cell (``ROW_HEADER``): its figures over the finished runs, how many of the
    planned runs those are, its last-10 against ``baseline``'s runs of the same seeds (FedAvg's; '-'
    without), its detection, the paper's figure and each seed's last-10."""
    detect = spread([detection_f1(p, column) for p in payloads])
    if column == "fedes" and any(quality_mse(p) is not None for p in payloads):
        detect = f"MSE {spread([quality_mse(p) for p in payloads], 1, 3)}"
    return [column, f"{sum(p is not None for p in payloads)}/{len(payloads)}", summary(payloads, "best_acc"),
            summary(payloads, "final_acc"), summary(payloads, "last10_mean_acc"), forgetting(payloads),
            "-" if baseline is None else versus(payloads, baseline), detect,
            "-" if paper is None else f"{paper:.2f}", per_seed(payloads)]


def leader(runs: dict[str, list[dict[str, Any] | None]], seeds: list[int]) -> str | None:
    """The method of the highest mean last-10 accuracy over the seeds where every method finished, and its
    margin over the next (paired per seed, mean ± std, points): whether the lead is over the seeds'
    spread. ``runs``: per method, its run of each of ``seeds`` (None: not finished). None unless two
    methods and one such seed."""
    complete = [at for at in range(len(seeds)) if all(run[at] for run in runs.values())]
    if len(runs) < 2 or not complete:
        return None
    kept = {column: [run[at] for at in complete] for column, run in runs.items()}
    means = {column: known_mean([p["summary"]["last10_mean_acc"] for p in payloads if p])
             for column, payloads in kept.items()}
    first, second = sorted(means, key=lambda column: -(means[column] or 0.0))[:2]
    on = [str(seeds[at]) for at in complete]
    named = f" {on[0]}" if len(on) == 1 else f"s {', '.join(on[:-1])} and {on[-1]}"
    return (f"leader by last-10 on seed{named}, where every method finished: "
            f"{first} {100 * (means[first] or 0.0):.2f}, {versus(kept[first], kept[second])} points over {second} "
            f"(paired per seed)")


def order(scores: dict[str, float]) -> str:
    """``fedcorr > fedavg > fedprox``: the methods from the highest score down (ties keep the given order)."""
    return " > ".join(sorted(scores, key=lambda method: -scores[method]))


def rank_table(cell: str, ours: dict[str, dict[str, float | None]]) -> Table | None:
    """Per paper of the cell: its order of the methods it reports beside ours of the same methods, by best
    and by last-10 mean accuracy (``ours``: figure -> method -> mean, None where no run finished), each
    marked where it differs from the paper's. A paper with fewer than two of our finished methods is left
    out; None when every paper is."""
    rows = []
    for paper, figures in PAPERS[cell].items():
        shared = [method for method in figures if all(ours[key].get(method) is not None for key in ours)]
        if len(shared) < 2:
            continue
        theirs = order({method: figures[method] for method in shared})
        mine = [order({method: ours[key][method] or 0.0 for method in shared})
                for key in ("best_acc", "last10_mean_acc")]
        rows.append([paper, theirs, *(f"{rank}{'' if rank == theirs else ' (differs)'}" for rank in mine)])
    return (["paper (CIFAR-10)", "paper's order", "ours by best", "ours by last-10"], rows) if rows else None


Key = tuple[str, str, int]
"""A run of one budget's table: (cell, column, seed)."""
Run = tuple[int, str, str, int]
"""A run of the whole plan: (budget, cell, column, seed)."""


def plan(args: argparse.Namespace, budget: int, seeds: dict[str, list[int]]) -> dict[Key, list[str]]:
    """Every run of one budget's table and its overrides."""
    return {(cell, column, seed): cell_run(cell, column, seed, budget, args.experiment, args.overrides, args.outputs)
            for cell in args.cells for seed in seeds[cell] for column in args.columns}


def obtain(args: argparse.Namespace, plans: dict[int, dict[Key, list[str]]], ledger: Ledger,
           launcher: Launcher) -> dict[int, dict[Key, dict[str, Any] | None]]:
    """Run (or reuse; with --report only read) every budget's runs, each continuing the same run at the
    largest smaller budget, planned or found, that finished and computed its rounds itself, where its
    strategy can."""
    if args.report:
        return {budget: {key: finished(overrides) for key, overrides in planned.items()}
                for budget, planned in plans.items()}
    runs: dict[Run, list[str]] = {(budget, cell, column, seed): overrides for budget, planned in plans.items()
                                  for (cell, column, seed), overrides in planned.items()}
    # Seed 1 of every cell first, so each cell's first row is complete early; within a cell and seed
    # the smaller budget first, so a longer run is ready before the next cell's runs.
    order = sorted(runs, key=lambda run: (run[3], args.cells.index(run[1]), run[0], args.columns.index(run[2])))
    planned_smaller = {budget: [b for b in plans if b < budget] for budget in plans}
    smaller = {budget: sorted({*shorter_budgets(args.outputs, args.experiment, budget), *planned_smaller[budget]},
                              reverse=True) for budget in plans}
    shorter: dict[Run, list[list[str]]] = {}
    extends: dict[Run, Run] = {}
    for budget, cell, column, seed in runs:
        shorter[(budget, cell, column, seed)] = [cell_run(cell, column, seed, other, args.experiment, args.overrides,
                                                          args.outputs) for other in smaller[budget]]
        # The smallest budget's run: a run that continued another cannot be continued in turn.
        if planned_smaller[budget]:
            extends[(budget, cell, column, seed)] = (min(planned_smaller[budget]), cell, column, seed)
    done = run_plan(runs, order, args.reuse, ledger, launcher, shorter, extends)
    return {budget: {(cell, column, seed): done[(budget, cell, column, seed)] for cell, column, seed in planned}
            for budget, planned in plans.items()}


def print_table(args: argparse.Namespace, budget: int, seeds: dict[str, list[int]],
                done: dict[Key, dict[str, Any] | None]) -> None:
    """One budget's table: per cell its rows, the papers' ranks beside ours, the course and the recall
    (those of ``args.tables``)."""
    width = max(9, *map(len, args.columns))

    def show(table: Table, widths: list[int] | None = None) -> None:
        """Print a table in Markdown, or fixed-width: the method's column and figures to ``widths``, or
        (None) every column left-aligned to its longest cell."""
        header, rows = table
        if args.markdown:  # a blank line on each side, so that no renderer takes the caption for a row
            lines = ["", *markdown_lines(header, rows), ""]
        elif widths is None:
            longest = [max(len(cells[k]) for cells in (header, *rows)) + 1 for k in range(len(header))]
            lines = fixed_width_lines(header, rows, longest, left=len(header))
        else:
            lines = fixed_width_lines(header, rows, [width, *widths])
        print("\n".join(lines))

    print(f"\nThe field on {args.experiment} at comm_budget={budget} client participations "
          f"(overrides {args.overrides}); test accuracy %, mean ± std over the seeds")
    for cell in args.cells:
        print(f"\n{cell} ({', '.join(CELLS[cell])}; seeds {seeds[cell]})")
        papers = {method: value for figures in PAPERS[cell].values() for method, value in figures.items()}
        runs = {column: [done[(cell, column, seed)] for seed in seeds[cell]] for column in args.columns}
        if "rows" in args.tables:
            fedavg = runs.get("fedavg")
            show((ROW_HEADER, [row(column, runs[column], papers.get(column), None if column == "fedavg" else fedavg)
                               for column in args.columns]), ROW_WIDTHS)
            lead = leader(runs, seeds[cell])
            if lead is not None:
                print(lead)
        ours = {key: {column: known_mean([run["summary"][key] for run in runs[column] if run])
                      for column in args.columns} for key in ("best_acc", "last10_mean_acc")}
        ranks = rank_table(cell, ours) if "ranks" in args.tables else None
        if ranks is not None:
            print("ranks: each paper's order of the methods it reports, and ours of the same methods")
            show(ranks)
        course = course_table(args.columns, runs, budget) if "course" in args.tables else None
        if course is not None:
            print(f"the course: mean test accuracy % of the last {COURSE_WINDOW} participations before each point")
            show(course, [11] * (len(course[0]) - 1))
        recall = recall_table(args.columns, runs) if "recall" in args.tables else None
        if recall is not None:
            print("final recall per class %: the share of each class's test images classified correctly")
            show(recall, [10] * (len(recall[0]) - 2) + [11])
    print(f"\n{made_at(list(done.values()))}")


def repeats(plans: dict[int, dict[Key, list[str]]], done: dict[int, dict[Key, dict[str, Any] | None]]) -> str | None:
    """Whether a run gives the same rounds when it is made again: each finished run at a larger budget
    that computed its rounds itself, against the same run at the smallest budget, where that finished
    too and the strategy's earlier rounds do not depend on the budget (all but FedNoRo's). Those two
    runs were separate processes, often on separate days or machines. None when no run has such a pair."""
    smallest = min(plans)
    compared, differing = 0, []
    for budget in sorted(plans)[1:]:
        for key, overrides in plans[budget].items():
            longer, shorter = done[budget][key], done[smallest][key]
            if not (longer and shorter and computed_afresh(longer) and budget_free(overrides)):
                continue
            compared += 1
            first = first_unrepeated(shorter, longer)
            if first is not None:
                differing.append(f"{key[0]} seed {key[2]} {key[1]} at {budget} from round {first}")
    if not compared:
        return None
    said = (f"the same run made again: {compared} runs at a larger budget ran from round 0 while the same run "
            f"at {smallest} had finished; ")
    if not differing:
        return said + "each repeats that run's rounds in every figure but the time"
    return said + f"{len(differing)} do not: " + "; ".join(differing)


def main() -> None:
    """Run (or reuse; with --report only read) every budget's runs and print each budget's table, the smaller first."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS), metavar="CELL")
    parser.add_argument("--columns", nargs="+", choices=CHOICES, default=list(COLUMNS), metavar="COLUMN",
                        help=f"of {', '.join(COLUMNS)} (the default), and FedCorr with another stage 3: "
                             f"{', '.join(FEDCORR_WITH)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds of every cell")
    parser.add_argument("--more-seeds", nargs="*", type=int, default=[2, 3],
                        help=f"further seeds of the {SEEDED_CELL} cell")
    parser.add_argument("--budget", type=int, nargs="+", default=[600],
                        help="client participations per run; several: a table each, a longer run continuing "
                             "the shorter")
    parser.add_argument("--experiment", default="fmnist", help="conf/experiment preset (smoke: a quick check)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables in Markdown (for docs/results.md), the same figures")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), metavar="TABLE",
                        help=f"which of each cell's tables to print, of {', '.join(TABLES)} (the default: all)")
    add_table_arguments(parser, "bench-field")
    args = parser.parse_args()
    launcher = launcher_from(args)
    for budget in args.budget:
        if budget < 1:
            raise ConfigError(f"--budget={budget} is invalid: allowed is an integer >= 1")
    seeds = {cell: sorted(set(args.seeds) | (set(args.more_seeds) if cell == SEEDED_CELL else set()))
             for cell in args.cells}
    plans = {budget: plan(args, budget, seeds) for budget in sorted(set(args.budget))}
    check_all([overrides for planned in plans.values() for overrides in planned.values()], args.reuse or args.report)
    ledger = Ledger()
    done = obtain(args, plans, ledger, launcher)
    for budget in plans:
        print_table(args, budget, seeds, done[budget])
    repeated = repeats(plans, done)
    if repeated is not None:
        print(f"\n{repeated}")
    print_time_saved(ledger)


if __name__ == "__main__":
    main_with_clear_errors(main)
