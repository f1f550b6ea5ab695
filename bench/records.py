"""Records of finished benchmark runs, kept in the repository so a benchmark's tables outlive the
machine that made its runs.

A benchmark's runs live under ``outputs/bench-*/``: checkpoints, round files and arrays, gone when the
work moves to another machine. ``save`` copies each finished run's results.json (its config, every
round, the summary and the method's blocks: all the benchmarks' tables read) to
``docs/records/<its path under outputs>.json``; ``restore`` writes each record back as results.json
where the outputs folder has no results.json of its own, so ``--reuse`` skips that run and
``--report`` prints it. A restored run has no checkpoints, so a longer run that would have continued
it (``extend_from``) runs from round 0 instead and says why. Each record keeps its runs' provenance
(the commit, the versions, the host, when it started).

    .venv/bin/python bench/records.py save [--outputs outputs] [--records docs/records] [--under bench-field]
    .venv/bin/python bench/records.py restore [--outputs outputs] [--records docs/records] [--under bench-field]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runs import ConfigError, main_with_clear_errors

# Imported after runs, which puts the project root ahead of bench/ on the path.
from common.run_files import RESULTS  # noqa: E402

RECORDS = Path(__file__).resolve().parents[1] / "docs" / "records"
BENCH_FOLDERS = "bench-*"
"""The folders under outputs/ that benchmarks write (bench-field, bench-fedcorr, ...)."""


def finished_runs(outputs: Path, under: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each finished run's folder under ``outputs/<under>`` and its results, in path order."""
    for path in sorted(outputs.glob(f"{under}/**/{RESULTS}")):
        payload = json.loads(path.read_text())
        if payload.get("complete"):
            yield path.parent, payload


def record_path(records: Path, outputs: Path, run: Path) -> Path:
    """Where the record of the run in ``run`` (a folder under ``outputs``) goes."""
    return records / f"{run.relative_to(outputs)}.json"


def save(outputs: Path, records: Path, under: str) -> tuple[int, int]:
    """Write the record of every finished run under ``outputs/<under>`` whose record is missing or holds
    other results; (written, already up to date)."""
    written = kept = 0
    for run, payload in finished_runs(outputs, under):
        target = record_path(records, outputs, run)
        text = json.dumps(payload, separators=(",", ":")) + "\n"
        if target.is_file() and target.read_text() == text:
            kept += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written += 1
    return written, kept


def restore(outputs: Path, records: Path, under: str) -> tuple[int, int]:
    """Write each record under ``records/<under>`` back as its run's results.json where that folder has
    none (an outputs folder's own results, finished or in progress, always win); (restored, skipped)."""
    restored = skipped = 0
    for record in sorted(records.glob(f"{under}/**/*.json")):
        target = outputs / record.relative_to(records).with_suffix("") / RESULTS
        if target.exists():
            skipped += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(record.read_text())
        restored += 1
    return restored, skipped


def main() -> None:
    """Save the finished runs' records, or restore them, as the command line asks."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("--outputs", type=Path, default=Path("outputs"), help="the folder the bench-* folders are in")
    parser.add_argument("--records", type=Path, default=RECORDS, help="the folder of the records")
    parser.add_argument("--under", default=BENCH_FOLDERS,
                        help="only the runs under this folder of outputs/ (a glob; default every benchmark's)")
    args = parser.parse_args()
    option, source = ("--outputs", args.outputs) if args.action == "save" else ("--records", args.records)
    if not source.is_dir():
        raise ConfigError(f"{option}={source} is invalid: allowed is an existing folder")
    if args.action == "save":
        written, kept = save(args.outputs, args.records, args.under)
        print(f"records: {written} written, {kept} already up to date, in {args.records}")
    else:
        restored, skipped = restore(args.outputs, args.records, args.under)
        print(f"records: {restored} restored as results.json under {args.outputs}, "
              f"{skipped} skipped (the folder has its own results.json)")


if __name__ == "__main__":
    main_with_clear_errors(main)
