"""The Flower ServerApp: ``serverapp = "server.app:app"`` in pyproject.toml."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.config import load_run
from server.run import run_server
from settings.compose import COMMAND_KEY, RUN_CONFIG_KEY, compose_from_run_config

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Compose the Hydra config from the run config's overrides, check it once, run the strategy."""
    command = context.run_config.get(COMMAND_KEY)
    run_server(grid, load_run(compose_from_run_config(context.run_config)),
               command=None if command is None else str(command),
               overrides=str(context.run_config.get(RUN_CONFIG_KEY, "")))
