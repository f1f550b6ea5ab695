#!/usr/bin/env bash
# Set up, then check and test everything: ruff (pyflakes, pycodestyle, import order, docstrings), mypy,
# the import contract of the layers (import-linter), and the whole pytest suite: the fast in-process tier
# on every core, then the end-to-end tier two test files at a time (a file's tests on one worker, so a
# module's shared run is made once; the tier waits on Ray's start-up and on subprocesses more than it
# computes, about half a core on average when run serially), with the deployment tests beside it (they
# start no Ray and wait on Flower's fixed 3 s polls and 30 s heartbeats between their ClientApp processes,
# one per message), but the deployment recovery tests (several minutes each: `bash scripts/test.sh -m
# recovery`). The e2e tier collects only
# tests/e2e: each of its workers would otherwise import every fast-tier module to deselect it (~10 s).
# Arguments replace that: they go to one pytest call, e.g. `bash scripts/test.sh tests/test_resume.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";          .venv/bin/ruff check .
echo "[test] import layers"; .venv/bin/lint-imports --no-cache
if [ "$#" -gt 0 ]; then
    echo "[test] mypy";      .venv/bin/mypy
    exec .venv/bin/python -m pytest "$@"
fi
echo "[test] fast tier";     .venv/bin/python -m pytest -m "not e2e" -n auto --dist worksteal -p no:cacheprovider
deploy_log=$(mktemp) mypy_log=$(mktemp)
set -m  # a process group of their own, which a Ctrl-C at the terminal does not reach: the trap stops them
.venv/bin/python -m pytest tests/e2e/test_deploy.py -m "e2e and not recovery" -p no:cacheprovider --durations=3 \
    > "$deploy_log" 2>&1 &
deploy=$!
set +m
# mypy (some 40 s of one core without its cache, as on a clean clone) runs beside the e2e tier too, which
# leaves about a core idle while it waits on Ray's start-ups; its report follows the tier's.
.venv/bin/mypy > "$mypy_log" 2>&1 &
typecheck=$!
# Should this script stop early, the deployment tests stop as on Ctrl-C: their fixtures end the federations.
trap 'kill -INT -- "-$deploy" 2>/dev/null || true; kill "$typecheck" 2>/dev/null || true
      wait "$deploy" "$typecheck" 2>/dev/null || true; rm -f "$deploy_log" "$mypy_log"' EXIT
echo "[test] end-to-end (mypy and the deployment tests run beside it; their reports follow)"
e2e=0 deployed=0 typed=0
.venv/bin/python -m pytest tests/e2e -m "e2e and not recovery" --ignore=tests/e2e/test_deploy.py -p no:cacheprovider \
    -n 2 --dist loadfile --durations=15 || e2e=$?
wait "$typecheck" || typed=$?
wait "$deploy" || deployed=$?
trap 'rm -f "$deploy_log" "$mypy_log"' EXIT
echo "[test] mypy"
cat "$mypy_log"
echo "[test] end-to-end: deployment tests"
cat "$deploy_log"
[ "$e2e" -eq 0 ] && [ "$deployed" -eq 0 ] && [ "$typed" -eq 0 ]
