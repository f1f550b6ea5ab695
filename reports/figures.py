"""The report's figures, drawn on matplotlib's Agg canvas (no display, no pyplot state).

Colours are Okabe and Ito's colour-blind-safe palette. Every function returns the ``Figure``; the
caller saves it. FedCorr's figures follow the paper: Fig. 3/6 (LID and cumulative LID of clean and
noisy clients per iteration), Fig. 7 top (estimated vs true noise level per client), Fig. 9
(accuracy over rounds with the stages), Fig. 2/10 (the partition: ``data.plot``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
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


def stage_spans(rounds: list[dict[str, Any]], x: str = "round") -> list[tuple[str, int, int]]:
    """(stage, first x, last x) for each run of consecutive rounds in one stage; x is the round or
    the communication cost after it."""
    spans: list[tuple[str, int, int]] = []
    for row in rounds:
        stage, number = str(row["stage"]), int(row[x])
        if spans and spans[-1][0] == stage:
            spans[-1] = (stage, spans[-1][1], number)
        else:
            spans.append((stage, number, number))
    return spans


def _shade_stages(axes: Axes, spans: list[tuple[str, int, int]]) -> None:
    names = list(dict.fromkeys(stage for stage, _, _ in spans))
    if len(names) < 2:
        return
    # Each stage runs from halfway after the previous stage's last point to halfway before the next one's first.
    edges = [spans[0][1] - 0.5] + [(a[2] + b[1]) / 2 for a, b in zip(spans, spans[1:])] + [spans[-1][2] + 0.5]
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


def _series(run: Run, key: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [row for row in run.rounds if row.get(key) is not None]
    return np.array([row[x] for row in rows]), np.array([row[key] for row in rows], dtype=float)


def curves_figure(groups: dict[str, list[Run]], x: str = "round") -> Figure:
    """Test accuracy (%) and test loss over rounds (``x="round"``) or over communication cost
    (``x="comm_cost"``, to compare methods whose rounds cost differently): one curve per single-run
    group, the mean with a ± std band per group of seeds; the stages of the first run that has
    several shaded."""
    figure = _figure(11.0, 4.6 + 0.22 * ((len(groups) + 1) // 2))
    accuracy, loss = figure.subplots(1, 2)
    for index, (label, runs) in enumerate(groups.items()):
        colour = OKABE_ITO[index % len(OKABE_ITO)]
        style = LINE_STYLES[(index // len(OKABE_ITO)) % len(LINE_STYLES)]
        for axes, key, scale in ((accuracy, "test_acc", 100.0), (loss, "test_loss", 1.0)):
            series = [_series(run, key, x) for run in runs]
            common = sorted(set.intersection(*(set(x.tolist()) for x, _ in series)))
            if not common:
                continue
            values = np.array([[dict(zip(x.tolist(), y.tolist()))[r] for r in common] for x, y in series]) * scale
            mean = values.mean(axis=0)
            name = label if len(runs) == 1 else f"{label} (mean ± std, {len(runs)} runs)"
            axes.plot(common, mean, color=colour, linestyle=style, linewidth=1.4, label=name)
            if len(runs) > 1:
                spread = values.std(axis=0, ddof=1)
                axes.fill_between(common, mean - spread, mean + spread, color=colour, alpha=0.25, linewidth=0)
    staged = next((run for runs in groups.values() for run in runs if len(stage_spans(run.rounds)) > 1), None)
    for axes in (accuracy, loss):
        axes.set_xlabel(X_AXES[x])
        axes.margins(x=0.01)
        if staged is not None:
            _shade_stages(axes, stage_spans(staged.rounds, x))
    accuracy.set_ylabel("test accuracy (%)")
    loss.set_ylabel("test loss (cross-entropy)")
    figure.legend(*accuracy.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    shaded = "" if staged is None else f" (shaded: the stages of {staged.path})"
    figure.suptitle(f"Test accuracy and loss over {X_AXES[x].split(' (')[0]}{shaded}", fontsize="medium")
    return figure


def _scores(block: dict[str, str | float]) -> dict[int, float]:
    return {int(client): float(value) for client, value in block.items()}


def lid_figure(run: Run) -> Figure | None:
    """Fig. 3/6: per FedCorr iteration, histograms of the clients' LID and cumulative LID, clean and
    noisy (the ground truth) apart; the cumulative panel marks the split the GMM made."""
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
    figure.suptitle("LID scores of clean and noisy clients (FedCorr Fig. 3/6; clean/noisy from the ground truth)")
    return figure


def noise_estimate_figure(run: Run) -> Figure | None:
    """Fig. 7 top: each client's estimated noise level mu_hat against the true noise of the labels it
    was estimated on; flagged clients in one colour, the others in another."""
    block = run.fedcorr
    rows = (block or {}).get("clients") or []
    points = [(r["true_noise_estimated_on"], r["mu_hat"], r["detected_noisy"]) for r in rows
              if r.get("true_noise_estimated_on") is not None and r.get("mu_hat") is not None]
    if not points:
        return None
    figure = _figure(5.2, 4.8)
    axes = figure.subplots()
    for flagged, colour, name in ((False, CLEAN, "not flagged (mu_hat = 0)"), (True, NOISY, "flagged noisy")):
        xs = [100 * x for x, _, f in points if f is flagged]
        ys = [100 * y for _, y, f in points if f is flagged]
        axes.scatter(xs, ys, s=14, color=colour, label=name)
    top = 100 * max(max(x, y) for x, y, _ in points) * 1.05 or 1.0
    axes.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle=":", label="mu_hat = true")
    axes.set_xlim(0, top)
    axes.set_ylim(0, top)
    axes.set_xlabel("true label noise of the client (%)")
    axes.set_ylabel("estimated noise level mu_hat (%)")
    mae = block.get("noise_estimate_mae") if block else None
    axes.set_title("Noise level per client after stage 1" + (f" (MAE {100 * mae:.1f} points)"
                                                              if isinstance(mae, float) else ""))
    axes.legend(fontsize="small")
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


def confusion_figure(run: Run, clients: list[int] | None = None) -> Figure | None:
    """Fig. 8: the (true label, label held) counts before correction, after stage 1 and after stage 2,
    summed over ``clients`` (default: the truly noisy clients, or all that reported under real noise),
    each row as % of its true class."""
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
    figure.suptitle(f"Labels against the truth, summed over {who} ({len(reported)} reported; FedCorr Fig. 8)",
                    fontsize="medium")
    return figure


SPLIT_PARTS = (("split_tp", "noisy, flagged"), ("split_fn", "noisy, missed"), ("split_fp", "clean, flagged"),
               ("split_tn", "clean, kept"))


def split_figure(run: Run) -> Figure | None:
    """Fig. 7 bottom: for each client the last stage-1 sample split made, its samples by truth (wrong
    or right label) and by the split's verdict (in the noisy subset D_n or not)."""
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
    axes.set_title("Sample split per client vs the truth (FedCorr Fig. 7 bottom)", fontsize="medium")
    return figure
