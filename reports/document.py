"""Write a report folder: PNG figures, the multi-run table (Markdown and CSV) and report.md."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from common.text import counted
from data.plot import class_counts, partition_figure
from data.scene import SCENE_FILE, Scene
from reports.figures import (
    X_AXES,
    choose_x,
    confusion_figure,
    curves_figure,
    lid_figure,
    noise_estimate_figure,
    split_figure,
)
from reports.runs import Run
from reports.tables import COLUMNS, HEADERS, group_runs, markdown, table_rows

# Above this many runs, per-run figures are drawn for the first run of each group only.
PER_RUN_FIGURES_UP_TO = 6
DPI = 110


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "run"


def _save(figure: Figure, path: Path) -> str:
    figure.savefig(path, dpi=DPI)
    return path.name


def partition_of(run: Run, drawn: set[str]) -> Figure | None:
    """The run's partition (Fig. 2/10) from its scene file, with each client's true noise rate; None
    without a scene file or when a scene of the same spec is in ``drawn`` already (then it is added)."""
    path = run.path / SCENE_FILE
    if not path.is_file():
        return None
    scene = Scene.load(path)
    spec = json.dumps(scene.spec, sort_keys=True)
    if spec in drawn:
        return None
    drawn.add(spec)
    num_classes = int(scene.spec["dataset"]["num_classes"])
    counts = class_counts(scene.client, scene.reference_labels(), scene.num_clients, num_classes)
    figure = partition_figure(counts, noise_rate=np.clip(scene.true_noise_rate(), 0, 1),
                              title=f"{run.dataset}: {counted(scene.num_clients, 'client')}")
    _noise_axis_in_percent(figure)
    return figure


def _noise_axis_in_percent(figure: Figure) -> None:
    """``data.plot`` draws the noise panel's rates as fractions; the report shows rates in %."""
    if len(figure.axes) > 1:
        noise = figure.axes[1]
        noise.xaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
        noise.set_xlabel(f"{noise.get_xlabel()} (%)")


def _write_csv(rows: list[dict[str, str]], path: Path) -> None:
    """The table as CSV under its ``HEADERS`` (units in the header, as in the Markdown table)."""
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow([HEADERS[column] for column in COLUMNS])
        writer.writerows([row[column] for column in COLUMNS] for row in rows)


def _run_labels(groups: dict[str, list[Run]]) -> dict[Path, str]:
    """Each run's name in its figures' titles: its group label, with its seed when the group has several."""
    return {run.path: label if len(runs) == 1 else f"{label}, seed {run.seed}"
            for label, runs in groups.items() for run in runs}


def write_report(runs: list[Run], out: Path, target: float, x: str = "auto",
                 clients: list[int] | None = None) -> Path:
    """Figures, table.md, table.csv and report.md for ``runs`` in ``out``; returns report.md's path.
    ``target`` is a fraction (printed in %); ``x``: the curves' horizontal axis, ``round``,
    ``comm_cost`` or ``auto`` (per dataset: ``figures.choose_x``); ``clients``: also draw the label
    confusion of these clients alone."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Run report", ""]
    unfinished = [run for run in runs if not run.complete]
    lines.append(f"{counted(len(runs), 'run')}; target accuracy {100 * target:g}%.")
    for run in unfinished:
        so_far = counted(len(run.rounds), "round")
        lines.append(f"- unfinished: `{run.path}` ({so_far} so far; its figures use what is there)")
    datasets = sorted({run.dataset for run in runs})
    for dataset in datasets:
        members = [run for run in runs if run.dataset == dataset]
        groups = group_runs(members)
        rows = table_rows(groups, target)
        tag = _slug(dataset)
        lines += ["", f"## {dataset}", "", markdown(rows)]
        (out / f"table-{tag}.md").write_text(markdown(rows))
        _write_csv(rows, out / f"table-{tag}.csv")
        axis = choose_x(groups, x)
        why = ", chosen as the runs' rounds differ in structure" if x == "auto" and axis == "comm_cost" else ""
        lines += [f"Curves over {X_AXES[axis]}{why}.", "",
                  f"![accuracy and loss over {axis}]({_save(curves_figure(groups, axis), out / f'curves-{tag}.png')})",
                  ""]
        labels = _run_labels(groups)
        per_run = members if len(members) <= PER_RUN_FIGURES_UP_TO else [group[0] for group in groups.values()]
        drawn_scenes: set[str] = set()
        for run in per_run:
            name = _slug(f"{run.path.parent.name}-{run.path.name}")
            label = labels[run.path]
            drawn = [(title, figure) for title, figure in (
                ("LID and cumulative LID per iteration", lid_figure(run, label)),
                ("estimated vs true noise level", noise_estimate_figure(run, label)),
                ("noisy-sample split per client", split_figure(run, label)),
                ("label confusion of the noisy clients", confusion_figure(run, label=label)),
                ("label confusion of the chosen clients", confusion_figure(run, clients, label) if clients else None),
                ("partition", partition_of(run, drawn_scenes))) if figure is not None]
            if not drawn:
                continue
            lines += [f"### {label}: `{run.path}`", ""]
            for title, figure in drawn:
                lines += [f"![{title}]({_save(figure, out / f'{_slug(title)}-{name}.png')})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report
