"""The report's figures, drawn on matplotlib's Agg canvas (no display, no pyplot state).

Colours are Okabe and Ito's colour-blind-safe palette. Every function returns the ``Figure``; the
caller saves it. FedCorr's figures follow the paper: Fig. 3/6 (LID and cumulative LID of clean and
noisy clients per iteration), Fig. 7 top (estimated vs true noise level per client), Fig. 9
(accuracy over rounds with the stages), Fig. 2/10 (the partition: ``data.plot``). Titles name a
group's label, never a file path; accuracies, noise levels and rates are in %.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from reports.runs import Run

OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
CLEAN, NOISY = OKABE_ITO[0], OKABE_ITO[3]
STAGE_SHADES = ("#f0f0f0", "#d9d9d9", "#bdbdbd", "#969696")
LINE_STYLES = ("-", "--", ":", "-.")


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


X_AXES = {"round": "communication round", "comm_cost": "communication cost (client participations)"}
X_CHOICES = ("auto", *X_AXES)
STAGE_CHANGE = "stage change"  # the gid of a method's own stage-change marks (dotted, in its colour)
# Where a curve's values may lie: a ± std band is cut to these (accuracy in %, loss >= 0).
LIMITS = {"test_acc": (0.0, 100.0), "test_loss": (0.0, np.inf)}

Spans = list[tuple[str, int, int]]


def stage_spans(rounds: list[dict[str, Any]], x: str = "round") -> Spans:
    """(stage, first x, last x) for each run of consecutive rounds in one stage; x is the round or
    the communication cost after it."""
    spans: Spans = []
    for row in rounds:
        stage, number = str(row["stage"]), int(row[x])
        if spans and spans[-1][0] == stage:
            spans[-1] = (stage, spans[-1][1], number)
        else:
            spans.append((stage, number, number))
    return spans


def common_spans(groups: dict[str, list[Run]], x: str) -> Spans | None:
    """The stage spans over ``x`` that every run of every group has (same stages over the same x
    ranges), or None when two runs differ: only then may one set of stages be shaded behind all."""
    distinct = {tuple(stage_spans(run.rounds, x)) for runs in groups.values() for run in runs}
    return list(distinct.pop()) if len(distinct) == 1 else None


def choose_x(groups: dict[str, list[Run]], x: str = "auto") -> str:
    """The curves' horizontal axis: ``x`` itself unless it is ``auto``; then ``comm_cost`` when the
    runs differ in their round structure (their stage spans over rounds or over communication cost:
    round r of one method is not round r of another), else ``round``."""
    if x != "auto":
        return x
    same = common_spans(groups, "round") is not None and common_spans(groups, "comm_cost") is not None
    return "round" if same else "comm_cost"


def stage_changes(spans: Spans) -> list[tuple[float, str]]:
    """(x, the stage that starts there) for each change of stage: halfway between one stage's last
    point and the next one's first."""
    return [((a[2] + b[1]) / 2, b[0]) for a, b in zip(spans, spans[1:])]


def _shade_stages(axes: Axes, spans: Spans) -> bool:
    """Shade each stage (one grey per stage name) and name it; False (nothing drawn) for one stage."""
    names = list(dict.fromkeys(stage for stage, _, _ in spans))
    if len(names) < 2:
        return False
    # Each stage runs from halfway after the previous stage's last point to halfway before the next one's first.
    edges = [spans[0][1] - 0.5] + [at for at, _ in stage_changes(spans)] + [spans[-1][2] + 0.5]
    for (stage, _, _), left, right in zip(spans, edges, edges[1:]):
        shade = STAGE_SHADES[names.index(stage) % len(STAGE_SHADES)]
        axes.axvspan(left, right, color=shade, alpha=0.6, linewidth=0, zorder=0)
    top = axes.get_ylim()[1]
    width = max(last for _, _, last in spans) - min(first for _, first, _ in spans) + 1
    for stage, first, last in spans:
        # A narrow stage gets its name upright, inside the plot, so neighbours do not overlap.
        narrow = (last - first + 1) < 0.12 * width
        axes.text((first + last) / 2, top, stage, ha="center", va="top" if narrow else "bottom",
                  rotation=90 if narrow else 0, fontsize="small")
    return True


def _group_changes(runs: list[Run], x: str) -> list[tuple[float, str]]:
    """Every stage change of a group's runs (a change its seeds share, once)."""
    return sorted({change for run in runs for change in stage_changes(stage_spans(run.rounds, x))})


DOT = 2.0  # points: the length of a dot of a stage-change line, and of the gap after it


def _mark_stage_changes(axes: Axes, marked: dict[str, tuple[list[tuple[float, str]], str]]) -> int:
    """A dotted line in each method's colour at each of its stage changes, with the name of the stage
    that starts there: used when the methods' stages differ, so none is shaded behind the others.
    ``marked``: per group, its changes and colour. The methods' dots take turns along a line, so two
    methods changing stage at the same x both stay visible. Returns how many lines were drawn."""
    period = 2 * DOT * len(marked)
    named: set[tuple[float, str]] = set()
    for lane, (changes, colour) in enumerate(marked.values()):
        dashes = ((period - 2 * DOT * lane) % period, (DOT, period - DOT))
        for at, stage in changes:
            axes.axvline(at, color=colour, linestyle=dashes, linewidth=1.3, zorder=1, gid=STAGE_CHANGE)
            if (at, stage) not in named:
                named.add((at, stage))
                axes.text(at, 0.99, f" {stage}", transform=axes.get_xaxis_transform(), rotation=90, ha="right",
                          va="top", fontsize="x-small", color=colour)
    return sum(len(changes) for changes, _ in marked.values())


def _series(run: Run, key: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [row for row in run.rounds if row.get(key) is not None]
    return np.array([row[x] for row in rows]), np.array([row[key] for row in rows], dtype=float)


def _plot_group(axes: Axes, runs: list[Run], key: str, x: str, label: str, colour: str, style: str) -> None:
    """One group's curve of ``key`` on the x values all its runs have: the run itself, or the mean
    with a ± std band cut to the metric's ``LIMITS`` (a band of accuracy beyond 100% or a negative
    loss would show values no run can have)."""
    scale = 100.0 if key == "test_acc" else 1.0
    series = [_series(run, key, x) for run in runs]
    common = sorted(set.intersection(*(set(xs.tolist()) for xs, _ in series)))
    if not common:
        return
    values = np.array([[dict(zip(xs.tolist(), ys.tolist()))[r] for r in common] for xs, ys in series]) * scale
    mean = values.mean(axis=0)
    name = label if len(runs) == 1 else f"{label} (mean ± std, {len(runs)} runs)"
    axes.plot(common, mean, color=colour, linestyle=style, linewidth=1.4, label=name)
    if len(runs) > 1:
        spread = values.std(axis=0, ddof=1)
        low, high = LIMITS[key]
        axes.fill_between(common, np.clip(mean - spread, low, high), np.clip(mean + spread, low, high),
                          color=colour, alpha=0.25, linewidth=0)


def curves_figure(groups: dict[str, list[Run]], x: str = "round") -> Figure:
    """Test accuracy (%) and test loss over rounds (``x="round"``) or over communication cost
    (``x="comm_cost"``, to compare methods whose rounds cost differently; ``auto``: ``choose_x``):
    one curve per single-run group, the mean with a ± std band per group of seeds. The stages are
    shaded only when every run has the same ones over the same x; otherwise each method's own stage
    changes are dotted in its colour, so no method's curve is read against another's stages."""
    x = choose_x(groups, x)
    figure = _figure(11.0, 4.6 + 0.22 * ((len(groups) + 2) // 2))
    accuracy, loss = figure.subplots(1, 2)
    colours = {label: OKABE_ITO[index % len(OKABE_ITO)] for index, label in enumerate(groups)}
    for index, (label, runs) in enumerate(groups.items()):
        style = LINE_STYLES[(index // len(OKABE_ITO)) % len(LINE_STYLES)]
        for axes, key in ((accuracy, "test_acc"), (loss, "test_loss")):
            _plot_group(axes, runs, key, x, label, colours[label], style)
    shared = common_spans(groups, x)
    note, marks = "", 0
    for axes in (accuracy, loss):
        axes.set_xlabel(X_AXES[x])
        axes.margins(x=0.01)
        if shared is not None:
            note = " (shaded: the stages, the same in every run)" if _shade_stages(axes, shared) else note
        else:
            marked = {label: (_group_changes(runs, x), colours[label]) for label, runs in groups.items()}
            marks = _mark_stage_changes(axes, {label: drawn for label, drawn in marked.items() if drawn[0]})
    handles, labels = accuracy.get_legend_handles_labels()
    if marks:
        note = " (the methods' stages differ: each one's stage changes dotted in its colour)"
        handles.append(Line2D([], [], color="0.3", linestyle=":", linewidth=1.3))
        labels.append("a method's stage change (dotted, in its colour; no shading)")
    accuracy.set_ylabel("test accuracy (%)")
    loss.set_ylabel("test loss (cross-entropy)")
    figure.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
    figure.suptitle(f"Test accuracy and loss over {X_AXES[x].split(' (')[0]}{note}", fontsize="medium")
    return figure


def _named(title: str, label: str | None) -> str:
    """A per-run figure's title, after the run's group label when there is one (never its path)."""
    return f"{label}: {title}" if label else title


def _scores(block: dict[str, str | float]) -> dict[int, float]:
    return {int(client): float(value) for client, value in block.items()}


def lid_figure(run: Run, label: str | None = None) -> Figure | None:
    """Fig. 3/6: per FedCorr iteration, histograms of the clients' LID and cumulative LID, clean and
    noisy (the ground truth) apart; the cumulative panel marks the split the GMM made. ``label`` (the
    run's group) heads the title."""
    block = run.fedcorr
    if not block or not block.get("iterations"):
        return None
    truth = set(block.get("true_noisy_clients") or [])
    iterations = block["iterations"]
    figure = _figure(10.0, 2.8 * len(iterations) + 0.6)
    grid = figure.subplots(len(iterations), 2, squeeze=False)
    for row, iteration in enumerate(iterations):
        for column, key in enumerate(("lid", "cumulative_lid")):
            axes = grid[row][column]
            scores = _scores(iteration[key])
            values = np.array(list(scores.values()))
            bins = np.linspace(values.min(), values.max(), 21) if np.ptp(values) > 0 else 10
            clean = [v for k, v in scores.items() if k not in truth]
            noisy = [v for k, v in scores.items() if k in truth]
            axes.hist([clean, noisy], bins=bins, color=[CLEAN, NOISY], label=["clean clients", "noisy clients"],
                      stacked=False, alpha=0.85)
            if key == "cumulative_lid":
                detected = set(iteration.get("detected_noisy_clients") or [])
                low = [v for k, v in scores.items() if k not in detected]
                high = [v for k, v in scores.items() if k in detected]
                if low and high:
                    axes.axvline((max(low) + min(high)) / 2, color="black", linestyle="--", linewidth=1,
                                 label="GMM split")
            axes.set_xlabel(("LID" if key == "lid" else "cumulative LID") + f" (iteration {iteration['iteration']})")
            axes.set_ylabel("clients")
            axes.yaxis.set_major_locator(MaxNLocator(integer=True))
            if row == 0:
                axes.legend(fontsize="small")
    figure.suptitle(_named("LID scores of clean and noisy clients (FedCorr Fig. 3/6; clean/noisy from the ground "
                           "truth)", label))
    return figure


POINT_AREA = 16.0  # the marker area (points^2) of one client; n clients at one point get n times it
# Fig. 7 top's two comparisons: (client field, the block's MAE of it, axis label, panel title).
NOISE_PANELS = (
    ("true_noise_estimated_on", "noise_estimate_mae", "true noise of the labels it was estimated on (%)",
     "against the noise it was estimated on"),
    ("true_noise_before", "noise_estimate_mae_original", "true noise before any correction (%)",
     "against the client's original noise"),
)


def coincident(points: list[tuple[float, float]]) -> list[tuple[float, float, int]]:
    """Identical points as one (x, y, how many), in the order first seen: many clients share a point
    (every clean, unflagged client sits at (0, 0)), and drawn one on top of another they would look
    like one."""
    counts = Counter((round(x, 9), round(y, 9)) for x, y in points)
    return [(x, y, n) for (x, y), n in counts.items()]


def _noise_panel(axes: Axes, rows: list[dict[str, Any]], field: str, top: float) -> None:
    """mu_hat (%) against one true noise (%) per client, flagged and not apart, coincident clients
    as one marker whose area grows with their number (the number written beside it)."""
    for flagged, colour, name in ((False, CLEAN, "not flagged (mu_hat = 0)"), (True, NOISY, "flagged noisy")):
        chosen = [r for r in rows if bool(r.get("detected_noisy")) is flagged]
        merged = coincident([(100 * r[field], 100 * r["mu_hat"]) for r in chosen])
        axes.scatter([p[0] for p in merged], [p[1] for p in merged], s=[POINT_AREA * p[2] for p in merged],
                     color=colour, alpha=0.7, edgecolors="white", linewidths=0.5, label=name, zorder=3)
        for px, py, n in merged:
            if n > 1:
                axes.annotate(str(n), (px, py), xytext=(6, -10), textcoords="offset points", fontsize="small",
                              color="0.2")
    axes.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle=":", label="mu_hat = true")
    # A little room below 0, so the markers at 0 (the clean clients) are drawn whole.
    axes.set_xlim(-0.04 * top, top)
    axes.set_ylim(-0.04 * top, top)
    axes.set_ylabel("estimated noise level mu_hat (%)")


def _mae(value: Any) -> str:
    """A mean absolute error of noise levels (a fraction in results.json) for a title, in points of %."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return f" (MAE {100 * value:.1f} percentage points)"


def noise_estimate_figure(run: Run, label: str | None = None) -> Figure | None:
    """Fig. 7 top in two panels: each client's estimated noise level mu_hat against the true noise of
    the labels it was estimated on (left: what the estimate can see, after earlier corrections) and
    against the client's original noise (right: ``true_noise_before``); each panel's title gives the
    block's mean absolute error of that comparison. Coincident clients are one marker, its area
    proportional to their number."""
    block = run.fedcorr or {}
    rows = [r for r in block.get("clients") or [] if r.get("mu_hat") is not None]
    per_panel = [[r for r in rows if r.get(field) is not None] for field, _, _, _ in NOISE_PANELS]
    if not any(per_panel):
        return None
    values = [100 * r[key] for panel, (field, _, _, _) in zip(per_panel, NOISE_PANELS) for r in panel
              for key in (field, "mu_hat")]
    top = max(values) * 1.05 or 1.0
    figure = _figure(10.4, 5.0)
    for axes, panel, (field, mae_key, xlabel, title) in zip(figure.subplots(1, 2), per_panel, NOISE_PANELS):
        axes.set_xlabel(xlabel)
        axes.set_title(title + _mae(block.get(mae_key)), fontsize="medium")
        if not panel:
            axes.text(0.5, 0.5, f"no {field} in this results.json", transform=axes.transAxes, ha="center")
            continue
        _noise_panel(axes, panel, field, top)
        handles, names = axes.get_legend_handles_labels()
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="none", markeredgecolor="0.4"))
        names.append("marker area ∝ clients at that point (number beside)")
        legend = axes.legend(handles, names, fontsize="x-small", loc="upper left")
        for handle in legend.legend_handles:
            if isinstance(handle, PathCollection):
                handle.set_sizes([POINT_AREA])  # the key shows one client's marker, not the first point's
    figure.suptitle(_named("estimated noise level per client after stage 1 (FedCorr Fig. 7 top)", label),
                    fontsize="medium")
    return figure


STAGE_MATRICES = (("before", "before correction"), ("after_stage1", "after stage 1"),
                  ("after_stage2", "after stage 2"))


def stage_confusions(matrices: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """A client's confusion counts at the three points, filling the ones it was not corrected at
    with the latest earlier one (its labels did not change in between)."""
    filled: dict[str, np.ndarray] = {}
    latest = np.asarray(matrices["before"])
    for key, _ in STAGE_MATRICES:
        latest = np.asarray(matrices.get(key, latest))
        filled[key] = latest
    return filled


def confusion_figure(run: Run, clients: list[int] | None = None, label: str | None = None) -> Figure | None:
    """Fig. 8: the (true label, label held) counts before correction, after stage 1 and after stage 2,
    summed over ``clients`` (default: the truly noisy clients, or all that reported under real noise),
    each row as % of its true class; ``label`` (the run's group) heads the title."""
    block = run.confusion
    if not block:
        return None
    chosen = clients if clients is not None else (run.fedcorr or {}).get("true_noisy_clients")
    reported = [pid for pid in block if chosen is None or int(pid) in set(chosen)]
    if not reported:
        return None
    per_client = [stage_confusions(block[pid]) for pid in reported]
    sums = {key: np.sum([matrices[key] for matrices in per_client], axis=0) for key, _ in STAGE_MATRICES}
    classes = int(round(sums["before"].size ** 0.5))
    figure = _figure(4.0 * len(STAGE_MATRICES) + 1.0, 4.2)
    grid = figure.subplots(1, len(STAGE_MATRICES))
    image = None
    for axes, (key, title) in zip(grid, STAGE_MATRICES):
        counts = np.asarray(sums[key], dtype=float).reshape(classes, classes)
        totals = counts.sum(axis=1, keepdims=True)
        share = 100 * counts / np.where(totals > 0, totals, 1)
        image = axes.imshow(share, cmap="cividis", vmin=0, vmax=100)
        wrong = 100 * (1 - np.trace(counts) / counts.sum()) if counts.sum() else 0.0
        axes.set_title(f"{title}: {wrong:.1f}% wrong", fontsize="medium")
        axes.set_xlabel("label held")
        axes.set_ylabel("true label")
        if classes <= 10:
            axes.set_xticks(range(classes))
            axes.set_yticks(range(classes))
            for i in range(classes):
                for j in range(classes):
                    axes.text(j, i, f"{share[i, j]:.0f}", ha="center", va="center", fontsize=7,
                              color="black" if share[i, j] > 50 else "white")
    if image is not None:
        figure.colorbar(image, ax=list(grid), label="% of the true class", shrink=0.8)
    who = "the truly noisy clients" if clients is None else f"clients {', '.join(map(str, clients))}"
    figure.suptitle(_named(f"labels against the truth, summed over {who} ({len(reported)} reported; FedCorr Fig. 8)",
                           label), fontsize="medium")
    return figure


SPLIT_PARTS = (("split_tp", "noisy, flagged"), ("split_fn", "noisy, missed"), ("split_fp", "clean, flagged"),
               ("split_tn", "clean, kept"))


def split_figure(run: Run, label: str | None = None) -> Figure | None:
    """Fig. 7 bottom: for each client the last stage-1 sample split made, its samples by truth (wrong
    or right label) and by the split's verdict (in the noisy subset D_n or not); ``label`` (the run's
    group) heads the title."""
    rows = [row for row in (run.fedcorr or {}).get("clients") or [] if row.get("split_tp") is not None]
    if not rows:
        return None
    figure = _figure(max(6.0, 0.12 * len(rows) + 2.0), 4.2)
    axes = figure.subplots()
    positions = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for (key, name), colour in zip(SPLIT_PARTS, (NOISY, OKABE_ITO[1], OKABE_ITO[4], CLEAN)):
        heights = np.array([row[key] for row in rows], dtype=float)
        axes.bar(positions, heights, bottom=bottom, color=colour, label=name, width=0.85)
        bottom += heights
    step = max(1, len(rows) // 30)
    axes.set_xticks(positions[::step], [str(row["client"]) for row in rows][::step], fontsize="small")
    axes.set_xlabel("client (those that made a stage-1 sample split)")
    axes.set_ylabel("samples")
    axes.legend(fontsize="small", ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    axes.set_title(_named("sample split per client vs the truth (FedCorr Fig. 7 bottom)", label), fontsize="medium")
    return figure
