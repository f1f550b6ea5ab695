"""Figures and tables from run directories.

    python report.py RUN_DIR [RUN_DIR ...] [--out DIR] [--target 0.85] [--x auto|round|comm_cost] [--clients K ...]

A RUN_DIR is one run (it holds results.json), a Hydra multirun folder (``sim.py -m`` lists its jobs
in runs.txt there) or any folder with runs below it. Writes to --out (default: report/): accuracy and
loss over rounds or over communication cost (--x; the default, auto, takes communication cost when the
groups' rounds differ in structure: other stages, or other stage spans; else rounds), one curve per run
or mean ± std per group of seeds, the stages shaded when every run has the same ones, else each
method's stage changes dotted in its colour; per FedCorr run
the LID histograms per iteration (Fig. 3/6), the estimated vs true noise per client, against the noise
each estimate was made on and against the client's original noise (Fig. 7 top), the
noisy-sample split per client against the truth (Fig. 7 bottom), the label confusion before and after
each stage summed over the noisy clients and over --clients (Fig. 8; simulation runs only),
the partition (Fig. 2/10) where the run's scene.npz is there, and per dataset a table of the groups
(runs that differ only in seed): best / final / last-10 accuracy, detection F1, label noise after
stage 2, and the rounds and communication cost to first reach --target, also as a ratio to FedCorr's
(Tables 11-13). Accuracies, noise levels and rates are shown in %; --target is a fraction, as in
results.json. Unfinished runs are used as far as they got, and said to be unfinished.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from common.errors import ConfigError, InvalidValue
from common.text import counted


def main(argv: list[str]) -> int:
    """The ``report.py`` command; bad input is one ``error:`` line and exit status 2."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", default="report", help="the report folder (created if needed)")
    parser.add_argument("--target", type=float, default=0.85, help="target test accuracy, a fraction in (0, 1]")
    parser.add_argument("--x", choices=("auto", "round", "comm_cost"), default="auto",
                        help="the curves' horizontal axis: rounds, or client participations so far; auto "
                             "(default): participations when the groups' round structures differ, else rounds")
    parser.add_argument("--clients", nargs="+", type=int, default=None, metavar="K",
                        help="also draw the label confusion of these clients alone")
    args = parser.parse_args(argv)
    try:
        if not (math.isfinite(args.target) and 0 < args.target <= 1):
            raise InvalidValue("--target", args.target, "a fraction in (0, 1]")
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise InvalidValue("--out", args.out, "a folder (this path is a file)")
        from reports.document import write_report  # matplotlib is slow to import: after the checks
        from reports.runs import find_runs

        runs = find_runs(args.runs)
        report = write_report(runs, out, args.target, args.x, args.clients)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {report} ({counted(len(runs), 'run')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
