#!/usr/bin/env bash
# Set up, then check and test everything: ruff (pyflakes, pycodestyle, import order, docstrings), mypy,
# the import contract of the layers (import-linter), and the whole pytest suite. Extra arguments go to
# pytest, e.g. `bash scripts/test.sh -m "not e2e" -n auto` for the fast in-process tier on every core (the whole
# suite runs serially: its end-to-end tests start Ray or deployments that take the machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff";          .venv/bin/ruff check .
echo "[test] mypy";          .venv/bin/mypy
echo "[test] import layers"; .venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
