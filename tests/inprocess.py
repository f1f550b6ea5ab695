"""A whole run of the ServerApp's logic over ``grid.LocalGrid`` (the real ClientApp handlers, no Ray),
in this process or, run as a script, in a child process a test can SIGKILL by its pid:

    python tests/inprocess.py <Hydra overrides>
    python tests/inprocess.py --bench bench/<script>.py <its arguments>

The overrides are taken as ``sim.py`` takes them (``ground_truth=true`` unless given), so a run here
computes what ``sim.py`` with the same overrides computes. ``--bench`` runs a bench script whose
simulations (``sim.run``) run so instead: the bench's own logic (planning, reuse, resume, shared
stages) as it is, without Ray.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]


def run(words: list[str]) -> dict:
    """Run the config of ``words`` to its end (or its resume); returns the results payload."""
    from flwr.supercore.task_identity import TaskIdentity
    from grid import LocalGrid

    from client.app import app as client_app
    from server.config import load_run
    from server.run import run_server
    from settings.compose import compose_config

    if not any(word.startswith("ground_truth=") for word in words):
        words = [*words, "ground_truth=true"]
    identity = [(name, getattr(TaskIdentity, name, None)) for name in ("_run_id", "_task_id", "_node_id")]
    for name, value in zip(("_run_id", "_task_id", "_node_id"), (1, 2, 77)):
        setattr(TaskIdentity, name, value)
    try:
        plan = load_run(compose_config(words))
        grid = LocalGrid(client_app, num_nodes=plan.settings.num_clients, run_config={"overrides": " ".join(words)})
        return run_server(grid, plan)
    finally:
        for name, value in identity:
            setattr(TaskIdentity, name, value)


def run_bench(script: str, args: list[str]) -> None:
    """Run the bench ``script`` with ``args`` as its command line, each of its simulations by ``run``."""
    import sim

    def simulate(cfg, overrides: list[str]) -> dict:
        """``sim.run``'s part: the run of the bench's ``overrides`` (its config is composed from them)."""
        return run(list(overrides))

    sim.run = simulate
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python <script>` has it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bench"]:
        run_bench(sys.argv[2], sys.argv[3:])
    else:
        run(sys.argv[1:])
