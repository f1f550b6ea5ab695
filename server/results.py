"""The results contract: <out_dir>/results.json and <out_dir>/rounds.csv, kept valid after every round.

results.json is rewritten atomically each round, so a run killed at any point leaves the rounds
finished so far in a readable file (``"complete": false`` until the run ends). Its
``test_confusion`` block is the confusion matrix of the latest central evaluation (at the end: the
final round's), which shows what an accuracy alone hides: a collapsed model, or a class map learnt
shifted under pair-flip noise.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic_files import write_json_atomic

ROUND_FIELDS = ("round", "stage", "test_acc", "test_loss", "clients", "comm_cost", "train_loss", "elapsed_s")


def summarise(rounds: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """best/final/last-10-mean test accuracy over the evaluated rounds, total comm cost, wall time."""
    accs = [r["test_acc"] for r in rounds if r["test_acc"] is not None]
    return {
        "best_acc": max(accs) if accs else None,
        "final_acc": accs[-1] if accs else None,
        "last10_mean_acc": sum(accs[-10:]) / len(accs[-10:]) if accs else None,
        "comm_cost": rounds[-1]["comm_cost"] if rounds else 0,
        "wall_s": round(wall_s, 3),
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


class ResultsWriter:
    """Collects one row per round and keeps results.json / rounds.csv up to date.

    out_dir: where the two files go (created if missing).
    config: the resolved run configuration, stored verbatim under "config".
    """

    def __init__(self, out_dir: str | Path, config: dict[str, Any]) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.rounds: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.confusion: dict[str, Any] | None = None
        self.start = time.perf_counter()
        with open(self.dir / "rounds.csv", "w", newline="") as out:
            csv.writer(out).writerow(ROUND_FIELDS)
        self._write(complete=False)

    @property
    def elapsed(self) -> float:
        """Seconds since the writer was created (the run's start)."""
        return time.perf_counter() - self.start

    def add_round(
        self,
        *,
        server_round: int,
        stage: str,
        clients: list[int],
        comm_cost: int,
        test_acc: float | None,
        test_loss: float | None,
        train_loss: float | None = None,
        test_confusion: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Append a finished round to rounds.csv and results.json (non-finite scores as null); returns its
        row. ``test_confusion`` (true class x predicted class counts) replaces the stored one."""
        row = {
            "round": server_round, "stage": stage, "test_acc": _finite(test_acc), "test_loss": _finite(test_loss),
            "clients": list(clients), "comm_cost": comm_cost, "train_loss": _finite(train_loss),
            "elapsed_s": round(self.elapsed, 3),
        }
        self.rounds.append(row)
        if test_confusion is not None:
            self.confusion = {"round": server_round, "rows": "true class", "columns": "predicted class",
                              "counts": np.asarray(test_confusion).astype(int).tolist()}
        with open(self.dir / "rounds.csv", "a", newline="") as out:
            csv.writer(out).writerow([" ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
                                      for v in (row[f] for f in ROUND_FIELDS)])
        self._write(complete=False)
        return row

    def write_table(self, name: str, rows: list[dict[str, Any]]) -> None:
        """A CSV next to results.json with one row per dict (columns: the keys, in first-seen order)."""
        if not rows:
            return
        columns = list(dict.fromkeys(key for row in rows for key in row))
        with open(self.dir / name, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Mark the run complete, adding method-specific blocks (e.g. ``fedcorr={...}``)."""
        self.extra.update(extra)
        return self._write(complete=True)

    def _write(self, *, complete: bool) -> dict[str, Any]:
        payload = {
            "complete": complete,
            "config": self.config,
            "rounds": self.rounds,
            "summary": summarise(self.rounds, self.elapsed),
            **({} if self.confusion is None else {"test_confusion": self.confusion}),
            **self.extra,
        }
        write_json_atomic(self.dir / "results.json", payload)
        return payload



def read_results(out_dir: str | Path) -> dict[str, Any]:
    """The results payload of a run; a run that did not complete is an error saying so."""
    payload = json.loads((Path(out_dir) / "results.json").read_text())
    if not payload.get("complete"):
        raise RuntimeError(f"the run writing {out_dir}/results.json did not complete; see its log above")
    return payload
