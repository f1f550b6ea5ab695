#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the default simulation (FedCorr on noisy
# Fashion-MNIST: 100 clients, noise rho=0.6 tau=0.5) through Flower's simulation engine on Ray.
# Extra arguments are Hydra overrides, e.g. `bash scripts/run.sh experiment=smoke`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python sim.py "$@"
