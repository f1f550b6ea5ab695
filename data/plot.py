"""Pictures of a federated partition, after FedCorr's Fig. 2 / Fig. 10.

Each client is one horizontal bar split into its per-class sample counts; clients are sorted by
local dataset size unless asked not to. An optional second panel shows each client's true noise rate.
Drawing uses matplotlib's Agg canvas directly, so no display and no pyplot global state are involved.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from common.errors import ConfigError

# Above this many clients a tick per client is unreadable, so only every k-th client is labelled.
_MAX_CLIENT_TICKS = 40
# Legend entries per column before the legend wraps into another column.
_LEGEND_ROWS = 25


def _check_ids(name: str, values: np.ndarray, count: int) -> None:
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise ConfigError(
            f"{name} of dtype {values.dtype} and shape {values.shape} is invalid: "
            "allowed is a 1-D integer array"
        )
    if values.size and (values.min() < 0 or values.max() >= count):
        bad = values[(values < 0) | (values >= count)][0]
        raise ConfigError(f"{name} contains {bad}: allowed are integers in [0, {count - 1}]")


def class_counts(client: np.ndarray, labels: np.ndarray, num_clients: int, num_classes: int) -> np.ndarray:
    """(num_clients, num_classes) int64 matrix: entry (k, j) counts samples of class j held by client k."""
    if num_clients < 1 or num_classes < 1:
        raise ConfigError(
            f"num_clients={num_clients}, num_classes={num_classes} are invalid: allowed are integers >= 1"
        )
    client, labels = np.asarray(client), np.asarray(labels)
    _check_ids("client", client, num_clients)
    _check_ids("labels", labels, num_classes)
    if client.shape != labels.shape:
        raise ConfigError(
            f"client has {client.size} entries but labels has {labels.size}: allowed is one client per label"
        )
    flat = client.astype(np.int64) * num_classes + labels.astype(np.int64)
    return np.bincount(flat, minlength=num_clients * num_classes).reshape(num_clients, num_classes)


def _class_colours(num_classes: int) -> list[tuple[float, float, float, float]]:
    # Qualitative maps keep neighbouring classes distinct; beyond 20 classes sample a continuous map.
    if num_classes <= 10:
        return [colormaps["tab10"](j) for j in range(num_classes)]
    if num_classes <= 20:
        return [colormaps["tab20"](j) for j in range(num_classes)]
    return [colormaps["turbo"](j / (num_classes - 1)) for j in range(num_classes)]


def partition_figure(
    counts: np.ndarray,
    *,
    noise_rate: np.ndarray | None = None,
    title: str = "",
    sort_by_size: bool = True,
    class_names: Sequence[str] | None = None,
) -> Figure:
    """Draws a (num_clients, num_classes) count matrix; the first client in display order is at the top.

    The stacked bars are ``axes[0].containers`` (one per class, one patch per displayed client) and the
    y tick labels are the client ids of the displayed rows.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2 or min(counts.shape) < 1:
        raise ConfigError(
            f"counts of shape {counts.shape} is invalid: allowed is (num_clients, num_classes), both >= 1"
        )
    num_clients, num_classes = counts.shape
    if class_names is not None and len(class_names) != num_classes:
        raise ConfigError(
            f"class_names has {len(class_names)} names: allowed is one per class ({num_classes})"
        )
    if noise_rate is not None:
        noise_rate = np.asarray(noise_rate, dtype=float)
        if noise_rate.shape != (num_clients,):
            raise ConfigError(
                f"noise_rate of shape {noise_rate.shape} is invalid: "
                f"allowed is one rate per client, shape ({num_clients},)"
            )
        outside = noise_rate[~((noise_rate >= 0) & (noise_rate <= 1))]
        if outside.size:
            raise ConfigError(f"noise_rate contains {outside[0]}: allowed are rates in [0, 1]")
    names = list(class_names) if class_names is not None else [str(j) for j in range(num_classes)]
    sizes = counts.sum(axis=1)
    # Stable sort, so clients of equal size keep their id order.
    order = np.argsort(-sizes, kind="stable") if sort_by_size else np.arange(num_clients)
    rows = np.arange(num_clients)

    # Grow with the client count so bars stay readable, within what a page or screen can hold.
    height = min(max(3.0, 1.5 + 0.12 * num_clients), 24.0)
    panels = 2 if noise_rate is not None else 1
    fig = Figure(figsize=(8.0 + 3.0 * (panels - 1), height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False, width_ratios=[3, 1][:panels])[0]

    bars = axes[0]
    left = np.zeros(num_clients)
    for j, colour in enumerate(_class_colours(num_classes)):
        widths = counts[order, j]
        bars.barh(rows, widths, left=left, height=0.85, color=colour, label=names[j])
        left = left + widths
    bars.set_xlabel("number of samples")
    bars.set_ylabel("client" + (" (sorted by local dataset size)" if sort_by_size else ""))
    step = max(1, math.ceil(num_clients / _MAX_CLIENT_TICKS))
    bars.set_yticks(rows[::step], [str(k) for k in order[::step]])
    bars.set_ylim(num_clients - 0.5, -0.5)  # first displayed client at the top
    fig.legend(
        *bars.get_legend_handles_labels(),
        title="class",
        loc="outside right upper",
        ncols=math.ceil(num_classes / _LEGEND_ROWS),
        fontsize="small",
    )

    if noise_rate is not None:
        noise = axes[1]
        noise.barh(rows, noise_rate[order], height=0.85, color="0.35")
        noise.set_xlim(0.0, 1.0)
        noise.set_xlabel("true noise rate")
    if title:
        fig.suptitle(title)
    return fig


def plot_partition(
    client: np.ndarray,
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    path: str | os.PathLike,
    *,
    noise_rate: np.ndarray | None = None,
    title: str = "",
    sort_by_size: bool = True,
    class_names: Sequence[str] | None = None,
) -> None:
    """Writes a PNG of the partition to ``path``, replacing it only once the picture is complete.

    client[i] is the client id (0..num_clients-1) of sample i and labels[i] its class; noise_rate, if
    given, holds each client's true noise rate for a second panel. On failure nothing new is left behind.
    """
    target = Path(path)
    if not target.parent.is_dir():
        raise ConfigError(
            f"plot directory {str(target.parent)!r} does not exist: allowed is an existing directory"
        )
    if target.is_dir():
        raise ConfigError(f"plot path {str(target)!r} is a directory: allowed is a file path")
    counts = class_counts(client, labels, num_clients, num_classes)
    fig = partition_figure(
        counts, noise_rate=noise_rate, title=title, sort_by_size=sort_by_size, class_names=class_names
    )
    # Render into a sibling temp file and rename: os.replace is atomic within one directory.
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            fig.savefig(stream, format="png", dpi=100)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
