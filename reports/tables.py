"""Multi-run tables: runs grouped by configuration (seeds together), mean ± std of their figures, and
the rounds and communication cost each needed to first reach a target accuracy (FedCorr Tables 11-13)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from reports.runs import Run


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: value}."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Settings that make the scene (the data every method is compared on), not the method.
SCENE_KEYS = ("dataset.", "partition.", "noise.", "num_clients", "model.")


def scene_of(flat: dict[str, Any]) -> str:
    """The scene part of a flattened config, as a comparable string."""
    return repr(sorted((k, repr(v)) for k, v in flat.items() if k.startswith(SCENE_KEYS)))


def _label(flat: dict[str, Any], everyone: list[dict[str, Any]]) -> str:
    """A group's name: its strategy, the scene settings that differ between the groups, then each
    setting where it departs from what most groups of its strategy use (defaults: nothing more)."""
    parts = [str(flat.get("strategy.name", "?"))]
    for key in sorted(flat):
        if key.startswith(SCENE_KEYS) and len({repr(peer.get(key)) for peer in everyone}) > 1:
            parts.append(f"{key}={flat.get(key)}")
    peers = [peer for peer in everyone if peer.get("strategy.name") == flat.get("strategy.name")]
    for key in sorted(flat):
        if key == "strategy.name" or key.startswith(SCENE_KEYS):
            continue
        values = [repr(peer.get(key)) for peer in peers]
        usual = max(sorted(set(values)), key=values.count)
        if len(set(values)) > 1 and repr(flat.get(key)) != usual:
            parts.append(f"{key.removeprefix('strategy.')}={flat.get(key)}")
    return " ".join(parts)


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by configuration without seed and out_dir, in the order first seen; each group is named by
    its strategy and the settings where it departs from that strategy's other groups."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group_key(), []).append(run)
    configs = {key: flatten({k: v for k, v in members[0].config.items() if k not in ("seed", "out_dir")})
               for key, members in groups.items()}
    named: dict[str, list[Run]] = {}
    for key, members in groups.items():
        label = _label(configs[key], list(configs.values()))
        named[label if label not in named else f"{label} ({len(named) + 1})"] = members
    return named


@dataclass(frozen=True)
class Reach:
    """When a run first reached the target accuracy: its round and communication cost (None: never)."""

    round: int | None
    comm_cost: int | None


def first_reach(run: Run, target: float) -> Reach:
    """The first evaluated round with test accuracy >= ``target``."""
    for row in run.rounds:
        if row.get("test_acc") is not None and row["test_acc"] >= target:
            return Reach(int(row["round"]), int(row["comm_cost"]))
    return Reach(None, None)


def mean_std(values: list[float | None], scale: float = 1.0, digits: int = 2, separator: str = " ± ") -> str:
    """Mean ± sample std of the known values ("-" for none, the value alone for one)."""
    known = [scale * v for v in values if v is not None]
    if not known:
        return "-"
    if len(known) == 1:
        return f"{known[0]:.{digits}f}"
    return f"{statistics.mean(known):.{digits}f}{separator}{statistics.stdev(known):.{digits}f}"


def _figure(block: dict[str, Any] | None, *path: str) -> float | None:
    value: Any = block
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, (int, float)) else None


def _accuracy(run: Run, key: str) -> float | None:
    """A summary accuracy (results.json keeps the summary of the rounds so far, finished or not)."""
    value = (run.payload.get("summary") or {}).get(key)
    return None if value is None else float(value)


COLUMNS = ("group", "runs", "seeds", "best %", "final %", "last-10 %", "detection F1", "label noise after s2 %",
           "rounds to target", "comm to target", "comm vs FedCorr")
"""The keys of a table row (other code reads rows by them, so they stay as they are)."""
# What the Markdown and CSV tables print above each column: its unit where the key has none.
HEADERS = {column: column for column in COLUMNS} | {"detection F1": "detection F1 %"}


def table_rows(groups: dict[str, list[Run]], target: float) -> list[dict[str, str]]:
    """One row per group (see ``COLUMNS``), accuracies, noise and detection F1 in % (what a person
    reads; results.json keeps fractions); "comm vs FedCorr" divides by the mean communication cost
    to the target of the first FedCorr group on the same scene, as Tables 11-13 do."""
    reach = {label: [first_reach(run, target) for run in runs] for label, runs in groups.items()}

    def mean_cost(label: str) -> float | None:
        costs = [r.comm_cost for r in reach[label] if r.comm_cost is not None]
        return statistics.mean(costs) if costs and len(costs) == len(reach[label]) else None

    scenes = {label: scene_of(flatten(runs[0].config)) for label, runs in groups.items()}
    references: dict[str, float | None] = {}
    for label, runs in groups.items():
        if runs[0].strategy == "fedcorr":
            references.setdefault(scenes[label], mean_cost(label))
    rows = []
    for label, runs in groups.items():
        reference = references.get(scenes[label])
        reached = [r for r in reach[label] if r.round is not None]
        missed = len(runs) - len(reached)
        note = f" ({missed} of {len(runs)} never)" if missed else ""
        cost = mean_cost(label)
        unfinished = sum(not run.complete for run in runs)
        rows.append({
            "group": label,
            "runs": f"{len(runs)}" + (f" ({unfinished} unfinished)" if unfinished else ""),
            "seeds": " ".join(str(run.seed) for run in runs),
            "best %": mean_std([_accuracy(run, "best_acc") for run in runs], 100),
            "final %": mean_std([_accuracy(run, "final_acc") for run in runs], 100),
            "last-10 %": mean_std([_accuracy(run, "last10_mean_acc") for run in runs], 100),
            "detection F1": mean_std([_figure(run.method_block, "detection", "f1") for run in runs], 100, 1),
            "label noise after s2 %": mean_std([_figure(run.fedcorr, "label_noise", "after_stage2") for run in runs],
                                               100),
            "rounds to target": mean_std([float(r.round) for r in reached if r.round is not None], 1, 1) + note,
            "comm to target": mean_std([float(r.comm_cost) for r in reached if r.comm_cost is not None], 1, 1) + note,
            "comm vs FedCorr": "-" if cost is None or not reference else f"{cost / reference:.2f}",
        })
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    """The rows as a Markdown table, under ``HEADERS``."""
    header = [HEADERS[column] for column in COLUMNS]
    return "\n".join(markdown_lines(header, [[row[column] for column in COLUMNS] for row in rows])) + "\n"


def markdown_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """A table's lines in Markdown: the header, the rule, a line per row."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(row)} |" for row in rows)]


def fixed_width_lines(header: list[str], rows: list[list[str]], widths: list[int], left: int = 1) -> list[str]:
    """A table's lines for a terminal: each column padded to its width, the first ``left`` columns
    left-aligned (names, text) and the others right-aligned (figures), one space between."""
    return [" ".join(cell.ljust(width) if k < left else cell.rjust(width)
                     for k, (cell, width) in enumerate(zip(cells, widths, strict=True))).rstrip()
            for cells in (header, *rows)]
