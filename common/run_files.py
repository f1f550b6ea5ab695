"""A run folder's results files as every reader finds them: results.json, and rounds.jsonl while the
run is in progress (results.json holds every round only once the run is complete)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = "results.json"
ROUNDS_JSONL = "rounds.jsonl"


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


