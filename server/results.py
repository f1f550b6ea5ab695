"""The results contract: <out_dir>/results.json, rounds.jsonl and rounds.csv, valid at every instant.

Each finished round appends one line to ``rounds.jsonl`` and one to ``rounds.csv`` and rewrites the
small ``results.json`` (config, summary, the latest confusion matrix; ``"complete": false``), so a
round costs the same at round 1,000 as at round 1, and a run killed at any point leaves readable
files. Each checkpoint adds the method's blocks as they stand (FedCorr's detection after each
stage-1 iteration, say), so a stopped run's file shows them too. When the run ends, results.json
gets every round and the method's blocks and ``"complete": true``, and arrays too large for it go to
files beside it (``confusion.npz``: the clients' label confusion counts). ``read_payload`` reads a
run in either state. Its ``test_confusion`` block is the confusion matrix of the latest central
evaluation (at the end: the final round's), which shows what an accuracy alone hides: a collapsed
model, or a class map learnt shifted under pair-flip noise.

A resumed run starts from its checkpoint's copy of the writer (``state``): both round files are
rewritten with the checkpoint's rounds, dropping whatever the killed attempt appended after it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic_files import write_json_atomic, write_npz, write_text_atomic
from common.run_files import CONFUSION, RESULTS, ROUNDS_JSONL, read_payload

ROUNDS_CSV = "rounds.csv"
ROUND_FIELDS = ("round", "stage", "test_acc", "test_loss", "clients", "comm_cost", "train_loss", "elapsed_s")
ARRAY_FILES = (CONFUSION,)
"""The array files a run may write beside results.json when it ends."""


def summarise(rounds: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """best/final/last-10-mean test accuracy over the evaluated rounds (and the first round that reached
    the best), total comm cost, wall time."""
    evaluated = [r for r in rounds if r["test_acc"] is not None]
    accs = [r["test_acc"] for r in evaluated]
    best = max(evaluated, key=lambda r: r["test_acc"]) if evaluated else None
    return {
        "best_acc": None if best is None else best["test_acc"],
        "best_round": None if best is None else best["round"],
        "final_acc": accs[-1] if accs else None,
        "last10_mean_acc": sum(accs[-10:]) / len(accs[-10:]) if accs else None,
        "comm_cost": rounds[-1]["comm_cost"] if rounds else 0,
        "wall_s": round(wall_s, 3),
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


class ResultsWriter:
    """Collects one row per round and keeps the results files up to date.

    out_dir: where the files go (created if missing).
    config: the resolved run configuration, stored verbatim under "config".
    state: a checkpoint's ``state()`` to continue from (None: a fresh run, whose files replace any).
    provenance: this attempt's ``server.provenance`` record, stored after those of the attempts before it.
    """

    def __init__(self, out_dir: str | Path, config: dict[str, Any], state: dict[str, Any] | None = None,
                 provenance: dict[str, Any] | None = None) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.rounds: list[dict[str, Any]] = [] if state is None else list(state["rounds"])
        self.extra: dict[str, Any] = {}
        self.confusion: dict[str, Any] | None = None if state is None else state["confusion"]
        self.before = 0.0 if state is None else float(state["elapsed_s"])
        # A checkpoint written before provenance was recorded has none: its attempts stay unknown.
        self.provenance: list[dict[str, Any]] = [] if state is None else list(state.get("provenance", []))
        if provenance is not None:
            self.provenance.append(provenance)
        self.start = time.perf_counter()
        if state is None:  # a fresh run: no array file of an earlier run in this folder stays beside its results
            for name in ARRAY_FILES:
                (self.dir / name).unlink(missing_ok=True)
        write_text_atomic(self.dir / ROUNDS_JSONL, "".join(_json_line(row) for row in self.rounds))
        write_text_atomic(self.dir / ROUNDS_CSV, _csv_lines([ROUND_FIELDS, *map(_csv_row, self.rounds)]))
        self._write(complete=False)

    @property
    def elapsed(self) -> float:
        """Seconds the run has taken so far, over every attempt."""
        return self.before + time.perf_counter() - self.start

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the results: the rounds so far, the latest confusion, the time and
        the attempts' provenance."""
        return {"rounds": list(self.rounds), "confusion": self.confusion, "elapsed_s": self.elapsed,
                "provenance": list(self.provenance)}

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
        """Append a finished round to the round files (non-finite scores as null) and refresh
        results.json; returns its row. ``test_confusion`` (true class x predicted class counts)
        replaces the stored one."""
        row = {
            "round": server_round, "stage": stage, "test_acc": _finite(test_acc), "test_loss": _finite(test_loss),
            "clients": list(clients), "comm_cost": comm_cost, "train_loss": _finite(train_loss),
            "elapsed_s": round(self.elapsed, 3),
        }
        self.rounds.append(row)
        if test_confusion is not None:
            self.confusion = {"round": server_round, "rows": "true class", "columns": "predicted class",
                              "counts": np.asarray(test_confusion).astype(int).tolist()}
        with open(self.dir / ROUNDS_JSONL, "a") as out:
            out.write(_json_line(row))
        with open(self.dir / ROUNDS_CSV, "a", newline="") as out:
            out.write(_csv_lines([_csv_row(row)]))
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

    def write_arrays(self, files: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """The run's array files beside results.json (name -> its arrays), each appearing whole
        (``write_npz``); an array file this run does not write is removed, so none is left from an
        earlier run in the folder."""
        unknown = sorted(set(files) - set(ARRAY_FILES))
        if unknown:
            raise ValueError(f"array files {unknown} are not results files: allowed are {list(ARRAY_FILES)}")
        for name in ARRAY_FILES:
            if name in files:
                write_npz(self.dir / name, files[name])
            else:
                (self.dir / name).unlink(missing_ok=True)

    def blocks(self, blocks: Mapping[str, Any]) -> None:
        """The method's blocks (``fedcorr={...}``) as of a checkpoint, in results.json while the run
        goes on: a stopped run's file shows what its method had found by then."""
        self.extra.update(blocks)
        self._write(complete=False)

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Mark the run complete, with every round and the method-specific blocks (``fedcorr={...}``)."""
        self.extra.update(extra)
        return self._write(complete=True)

    def _write(self, *, complete: bool) -> dict[str, Any]:
        payload = {
            "complete": complete,
            "config": self.config,
            **({"rounds": self.rounds} if complete else {}),
            "summary": summarise(self.rounds, self.elapsed),
            **({"provenance": self.provenance} if self.provenance else {}),
            **({} if self.confusion is None else {"test_confusion": self.confusion}),
            **self.extra,
        }
        write_json_atomic(self.dir / RESULTS, payload)
        return payload


def _json_line(row: dict[str, Any]) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def _csv_row(row: dict[str, Any]) -> list[Any]:
    return [" ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
            for v in (row[f] for f in ROUND_FIELDS)]


def _csv_lines(rows: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def read_results(out_dir: str | Path) -> dict[str, Any]:
    """The results payload of a finished run; a run that did not complete is an error saying so."""
    payload = read_payload(out_dir)
    if not payload.get("complete"):
        raise RuntimeError(f"the run writing {out_dir}/{RESULTS} did not complete; see its log above")
    return payload
