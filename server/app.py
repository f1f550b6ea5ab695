"""The Flower ServerApp: ``serverapp = "server.app:app"`` in pyproject.toml."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.config import load_run
from server.run import run_server
from settings.compose import compose_from_run_config

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Compose the Hydra config from the run config's overrides, check it once, run the strategy."""
    run_server(grid, load_run(compose_from_run_config(context.run_config)))
