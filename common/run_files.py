"""A run folder's results files as every reader finds them: results.json, rounds.jsonl while the
run is in progress (results.json holds every round only once the run is complete), and the per-client
label confusion counts in confusion.npz (too large for results.json: M x M counts per client and point)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic_files import read_npz

RESULTS = "results.json"
ROUNDS_JSONL = "rounds.jsonl"
CONFUSION = "confusion.npz"
CONFUSION_POINTS = ("before", "after_stage1", "after_stage2")
"""The points a client's (true label, label held) counts are taken at: before its first correction,
and after its latest correction of stage 1 and of stage 2 (FedCorr Fig. 8)."""


def read_rounds(out_dir: str | Path) -> list[dict[str, Any]]:
    """The rounds in ``rounds.jsonl`` (a line cut short by a kill is not a round)."""
    rows: list[dict[str, Any]] = []
    path = Path(out_dir) / ROUNDS_JSONL
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def read_payload(out_dir: str | Path) -> dict[str, Any]:
    """The results payload of a run, finished or not: a run in progress (or killed) gets its rounds
    from ``rounds.jsonl``."""
    payload = json.loads((Path(out_dir) / RESULTS).read_text())
    if "rounds" not in payload:
        payload["rounds"] = read_rounds(out_dir)
    return payload


def confusion_arrays(per_client: Mapping[int, Mapping[str, Sequence[int] | np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of confusion.npz from each client's row-major M x M counts at the points it
    reported (``before`` always; each ``CONFUSION_POINTS`` entry at most once):

    - ``clients`` (K,): the partition ids, ascending;
    - ``<point>`` (K, M, M) int64 per point: the counts there; a client not corrected at a point
      carries its latest earlier counts (its labels did not change in between);
    - ``reported_<point>`` (K,) bool: whether the client reported counts at that point.
    """
    clients = sorted(per_client)
    sizes = {np.asarray(matrix).size for matrices in per_client.values() for matrix in matrices.values()}
    if len(sizes) > 1:
        raise ValueError(f"confusion counts of different sizes {sorted(sizes)}: one run has one number of classes")
    classes = round(sizes.pop() ** 0.5) if sizes else 0
    arrays: dict[str, np.ndarray] = {"clients": np.asarray(clients, dtype=np.int64)}
    for point in CONFUSION_POINTS:
        arrays[point] = np.zeros((len(clients), classes, classes), dtype=np.int64)
        arrays[f"reported_{point}"] = np.zeros(len(clients), dtype=bool)
    for row, pid in enumerate(clients):
        matrices = per_client[pid]
        unknown = sorted(set(matrices) - set(CONFUSION_POINTS))
        if unknown or "before" not in matrices:
            raise ValueError(f"client {pid}'s confusion points {sorted(matrices)}: allowed are {CONFUSION_POINTS}, "
                             "'before' among them")
        latest = np.asarray(matrices["before"])
        for point in CONFUSION_POINTS:
            if point in matrices:
                latest = np.asarray(matrices[point])
                arrays[f"reported_{point}"][row] = True
            arrays[point][row] = latest.reshape(classes, classes)
    return arrays


def read_confusion(out_dir: str | Path) -> dict[str, dict[str, list[int]]]:
    """A run's confusion.npz as {client id (str): {point: row-major counts}}, each client with the points
    it reported only; {} for a run without the file."""
    path = Path(out_dir) / CONFUSION
    if not path.is_file():
        return {}
    arrays = read_npz(path)
    return {str(int(pid)): {point: arrays[point][row].reshape(-1).tolist()
                            for point in CONFUSION_POINTS if arrays[f"reported_{point}"][row]}
            for row, pid in enumerate(arrays["clients"])}
