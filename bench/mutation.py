"""Mutation score of one source file at a time against the fast-tier tests that cover it (a measure, not a test).

    .venv/bin/python bench/mutation.py task/lid.py [task/correction.py ...]
    .venv/bin/python bench/mutation.py --all      # every file in TESTS, one after another
    .venv/bin/python bench/mutation.py --list     # the declared map: source file -> test files
    .venv/bin/python bench/mutation.py strategies/fedcorr.py --only '*ǁFedCorrǁrestore__*'   # some functions

Needs the `mutation` extra (`.venv/bin/pip install -e '.[mutation]'`). For each file, mutmut copies the
project into mutants/ (emptied first), writes every mutant of that file alone, runs the file's test
files from TESTS once to learn which test reaches which function, and then, for each mutant, only the
tests that reach its function; one test process at a time. A mutant is killed when a test fails, and
timed out when the tests run far past their clean time (an endless loop: also caught). The score is
(killed + timeout) / (total - equivalent), where equivalent mutants are those docs/mutation.md lists
by name because no input can tell them from the original. Survivors not listed there are printed
with their diff. mutants/ stays for a look (`.venv/bin/mutmut show NAME`) until the next run.

``--only`` runs and scores just the mutants whose names match its patterns (fnmatch, as mutmut takes
them): after a change to a few functions, their mutants, without the hours a whole file can take.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib.util
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "docs" / "mutation.md"
WORK = ROOT / "mutants"

# The files of the mutation target and the fast-tier test files that reach each of them, directly or
# through a client or strategy that uses them. More test files cost only the two whole-file runs
# (stats, clean); each mutant runs just the tests that call its function.
_FEDCORR_STRATEGY = ("tests/test_fedcorr_stages.py", "tests/test_fedcorr_metrics.py", "tests/test_eval_cadence.py",
                     "tests/test_participation.py")
_STRATEGY_CORE = ("tests/test_strategies.py", "tests/test_baselines.py", "tests/test_registry.py")
TESTS: dict[str, tuple[str, ...]] = {
    "strategies/aggregation.py": ("tests/test_strategies.py", "tests/test_baselines.py"),
    "strategies/base.py": (*_STRATEGY_CORE, "tests/test_strategy_base.py", "tests/test_eval_cadence.py",
                           "tests/test_feddiv.py", "tests/test_fedes.py", "tests/test_rfa.py",
                           "tests/test_participation.py", "tests/test_bad_input.py"),
    "strategies/context.py": (*_STRATEGY_CORE, "tests/test_declared_constraints.py"),
    "strategies/detection.py": ("tests/test_fedcorr_metrics.py", "tests/test_feddiv.py", "tests/test_reply_fields.py"),
    "strategies/fedavg.py": (*_STRATEGY_CORE, "tests/test_eval_cadence.py", "tests/test_fedavg.py",
                             "tests/test_progress.py", "tests/test_participation.py"),
    "strategies/fedcorr.py": (*_FEDCORR_STRATEGY, "tests/test_declared_constraints.py", "tests/test_progress.py",
                              "tests/test_fedcorr_strategy.py", "tests/test_learners.py", "tests/test_baselines.py"),
    "strategies/fedcorr_metrics.py": (*_FEDCORR_STRATEGY, "tests/test_fedcorr_monitor.py"),
    "strategies/feddiv.py": ("tests/test_feddiv.py", "tests/test_feddiv_monitor.py", "tests/test_feddiv_strategy.py"),
    "strategies/feddyn.py": ("tests/test_baselines.py",),
    "strategies/federation.py": _STRATEGY_CORE,
    "strategies/fedes.py": ("tests/test_fedes.py",),
    "strategies/fedes_quality.py": ("tests/test_fedes.py",),
    "strategies/fedlsr.py": ("tests/test_baselines.py", "tests/test_learners.py"),
    "strategies/fedmedian.py": ("tests/test_baselines.py",),
    "strategies/fednoro.py": ("tests/test_fednoro.py",),
    "strategies/fednoro_detection.py": ("tests/test_fednoro.py",),
    "strategies/fedprox.py": ("tests/test_baselines.py",),
    "strategies/ground_truth.py": ("tests/test_fedcorr_metrics.py", "tests/test_feddiv.py", "tests/test_resume.py"),
    "strategies/participation.py": ("tests/test_participation.py",),
    "strategies/poc.py": ("tests/test_baselines.py", "tests/test_participation.py"),
    "strategies/registry.py": ("tests/test_registry.py", "tests/test_declared_constraints.py"),
    "strategies/replies.py": ("tests/test_strategies.py",),
    "strategies/rfa.py": ("tests/test_rfa.py",),
    "strategies/rounds.py": ("tests/test_rounds.py", "tests/test_declared_constraints.py",
                             "tests/test_fedcorr_stages.py", "tests/test_baselines.py", "tests/test_bad_input.py"),
    "strategies/sampling.py": ("tests/test_strategies.py",),
    "strategies/scaffold.py": ("tests/test_scaffold.py",),
    "client/plugins/__init__.py": ("tests/test_registry.py",),
    "client/plugins/base.py": ("tests/test_registry.py", "tests/test_client_app.py"),
    "client/plugins/registry.py": ("tests/test_registry.py", "tests/test_client_app.py"),
    "client/plugins/fedcorr.py": ("tests/test_fedcorr_client.py",),
    "client/plugins/feddiv.py": ("tests/test_feddiv.py", "tests/test_feddiv_filter.py",
                                 "tests/test_feddiv_training.py"),
    "client/plugins/feddyn.py": ("tests/test_baselines.py", "tests/test_training.py", "tests/test_feddyn_plugin.py"),
    "client/plugins/fedes.py": ("tests/test_fedes.py",),
    "client/plugins/fednoro.py": ("tests/test_fednoro.py",),
    "client/plugins/scaffold.py": ("tests/test_scaffold.py",),
    "task/learners/__init__.py": ("tests/test_learners.py",),
    "task/learners/base.py": ("tests/test_learners.py", "tests/test_training.py"),
    "task/learners/ce.py": ("tests/test_learners.py", "tests/test_training.py"),
    "task/learners/coteaching.py": ("tests/test_learners.py",),
    "task/learners/logit_adjusted.py": ("tests/test_fednoro.py",),
    "task/learners/lsr.py": ("tests/test_learners.py", "tests/test_training.py"),
    "task/learners/mixup.py": ("tests/test_learners.py", "tests/test_training.py"),
    "task/learners/sce.py": ("tests/test_learners.py",),
    "task/learners/uniform_prior.py": ("tests/test_feddiv.py",),
    "task/lid.py": ("tests/test_lid.py", "tests/test_fedcorr_client.py"),
    "task/correction.py": ("tests/test_correction.py", "tests/test_fedcorr_client.py"),
    "task/noise_filter.py": ("tests/test_feddiv.py",),
    "task/selective_gradient.py": ("tests/test_fedes.py",),
}

# Counted as caught: a failing test, or tests that ran far past their clean time.
CAUGHT = {"killed", "timeout"}


def equivalents() -> dict[str, str]:
    """Mutant name -> reason, from the table rows of docs/mutation.md that name a mutant."""
    if not EQUIVALENTS.exists():
        return {}
    listed = {}
    for line in EQUIVALENTS.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([^`\s]+__mutmut_\d+)`", cells[0]) if len(cells) >= 2 else None
        if match:
            listed[match.group(1)] = cells[-1]
    return listed


def _module_of(mutant: str) -> str:
    """``task.learners.lsr`` of ``task.learners.lsr.x_lsr_loss__mutmut_3`` (a method's: ``.xǁClassǁname``),
    so a package's ``__init__`` does not claim its submodules' mutants."""
    return re.sub(r"\.x[_ǁ][^.]*$", "", mutant)


def mutate(source: str, only: list[str]) -> int:
    """In this process: mutmut on ``source`` alone with its test files (and of its mutants only those
    matching a pattern of ``only``, if any), then its score. Returns 0 when every mutant run and not
    listed as equivalent was caught."""
    from mutmut import configuration  # the `mutation` extra; imported only here, in the worker
    from mutmut.__main__ import cli
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.stats import status_by_exit_code

    if not mutate_file_contents(source, (ROOT / source).read_text(), None, None).mutant_names:
        # Re-exports and constants only: mutmut would stop, finding no test that reaches a mutant.
        print(f"\nSCORE {source}: no mutants (nothing but imports and constants)")
        return 0

    # bench/ holds a data.py that would shadow the data package; the mutants/ copy is what tests import.
    sys.path[:] = [path for path in sys.path if Path(path or ".").resolve() != Path(__file__).resolve().parent]
    # [tool.mutmut] in pyproject.toml says what to copy and how to call pytest; the file and its tests
    # are set here, for one run. (A private global of mutmut 3.8, which the extra pins.)
    configuration._config = dataclasses.replace(
        configuration.config(), only_mutate=[source], pytest_add_cli_args_test_selection=list(TESTS[source]))
    started = time.monotonic()
    cli.main(["run", "--max-children", "1", *only], standalone_mode=False)
    minutes = (time.monotonic() - started) / 60

    data = SourceFileMutationData(path=source)
    data.load()
    status = {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()
              if not only or any(fnmatch.fnmatch(name, pattern) for pattern in only)}
    listed = equivalents()
    equivalent = {name for name, state in status.items() if name in listed and state == "survived"}
    counts = {state: sum(1 for s in status.values() if s == state) for state in sorted(set(status.values()))}
    caught = sum(1 for s in status.values() if s in CAUGHT)
    pool = len(status) - len(equivalent)
    escaped = sorted(name for name, state in status.items() if state not in CAUGHT and name not in equivalent)
    module = source.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    stale = sorted(name for name in listed if _module_of(name) == module and name not in equivalent
                   and (not only or name in status))

    print(f"\n{source}: {len(status)} mutants in {minutes:.1f} min; "
          + ", ".join(f"{state} {count}" for state, count in counts.items()) + f"; equivalent {len(equivalent)}")
    timeouts = sorted(name for name, state in status.items() if state == "timeout")
    if timeouts:
        # Counted as caught: the tests used about 30 times their clean CPU time (a loop that does not end,
        # or work blown up by the change); listed so that a suspicious one can be looked at.
        print("\ntimeout: " + " ".join(timeouts))
    for name in escaped:
        print(f"\n{status[name]}: {name}\n{get_diff_for_mutant(name, path=source)}")
    for name in stale:
        found = status.get(name, "not generated")
        print(f"\nlisted in {EQUIVALENTS.relative_to(ROOT)} as equivalent but {found}: {name}")
    score = 100.0 * caught / pool if pool else 100.0
    scope = f" ({len(status)} matching {' '.join(only)})" if only else ""
    print(f"\nSCORE {source}{scope}: {caught}/{pool} = {score:.1f}% of non-equivalent mutants caught "
          f"(killed {counts.get('killed', 0)}, timeout {counts.get('timeout', 0)}, "
          f"survived {counts.get('survived', 0)}, total {len(status)}, equivalent {len(equivalent)})")
    return 1 if escaped else 0


def main() -> int:
    """Mutate the files given, each in a process of its own; 0 when every file's mutants were caught."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="source files, as keys of TESTS (e.g. task/lid.py)")
    parser.add_argument("--all", action="store_true", help="every file in TESTS")
    parser.add_argument("--list", action="store_true", help="print the map of source file -> test files")
    parser.add_argument("--only", nargs="+", default=[], metavar="PATTERN",
                        help="only the mutants whose names match one of these fnmatch patterns (one file)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.list:
        for source, tests in TESTS.items():
            print(f"{source}: {' '.join(tests)}")
        return 0
    files = list(TESTS) if args.all else args.files
    unknown = [source for source in files if source not in TESTS]
    if unknown or not files:
        parser.error(f"give files declared in TESTS (--list shows them); unknown: {' '.join(unknown) or 'none given'}")
    if args.only and len(files) != 1:
        parser.error("--only takes one file: mutant names belong to one file")
    if importlib.util.find_spec("mutmut") is None:
        # Not installed by scripts/setup.sh: CI does not mutate, and the extra pins a tool only this uses.
        print("error: bench/mutation.py needs mutmut, the mutation extra: "
              ".venv/bin/python -m pip install -e \".[mutation]\"", file=sys.stderr)
        return 2
    if args.in_process:
        return mutate(files[0], args.only)
    # One process per file: mutmut imports the mutated modules and keeps its state in module globals.
    failed = []
    for source in files:
        shutil.rmtree(WORK, ignore_errors=True)
        only = ["--only", *args.only] if args.only else []
        done = subprocess.run([sys.executable, __file__, "--in-process", source, *only], cwd=ROOT, check=False)
        if done.returncode:
            failed.append(source)
    if failed:
        print(f"\nnot every non-equivalent mutant caught (or mutmut failed): {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
