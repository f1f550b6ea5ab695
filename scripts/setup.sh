#!/usr/bin/env bash
# Idempotent set-up: Fashion-MNIST from Debian (when missing), a virtual environment in .venv with
# the project and its test tools. Re-running it is cheap: pip runs only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
FMNIST=/usr/share/datasets/fashion-mnist

if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "[setup] installing Fashion-MNIST from Debian (dataset-fashion-mnist)"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist \
        || echo "[setup] warning: could not apt-get install dataset-fashion-mnist; set dataset.root to a copy"
fi

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $PYTHON"
    "$PYTHON" -m venv .venv
fi

stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing the project and its dependencies into .venv (first run: a few minutes)"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    # pip byte-compiles the environment (~35 s of CPU): where PYTHONDONTWRITEBYTECODE is set, as on
    # this machine, Python would otherwise compile torch, Ray and Flower again in every process.
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
