#!/usr/bin/env bash
# Set up, then check and test everything: ruff (pyflakes, pycodestyle, import order, docstrings), mypy,
# the import contract of the layers (import-linter), and the whole pytest suite: the fast in-process tier
# on every core, then the end-to-end tier serially (its tests start Ray or deployments that take the
# machine), but the deployment recovery tests (several minutes each: `bash scripts/test.sh -m recovery`).
# Arguments replace that: they go to one pytest call, e.g. `bash scripts/test.sh tests/test_resume.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";          .venv/bin/ruff check .
echo "[test] mypy";          .venv/bin/mypy
echo "[test] import layers"; .venv/bin/lint-imports --no-cache
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
echo "[test] fast tier";     .venv/bin/python -m pytest -m "not e2e" -n auto --dist worksteal -p no:cacheprovider
echo "[test] end-to-end";    exec .venv/bin/python -m pytest -m "e2e and not recovery" -p no:cacheprovider --durations=15
