#!/usr/bin/env bash
# The main job on a fresh machine: set up, then build the default scene (noisy Fashion-MNIST,
# 100 clients, FedCorr noise rho=0.6 tau=0.5) and print its summary. Extra arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m data.scene "$@"
