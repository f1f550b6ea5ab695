"""The Flower ServerApp: ``serverapp = "server.app:app"`` in pyproject.toml."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from conf import compose_from_run_config
from server.run import run_server

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Compose the Hydra config from the run config's overrides and run the configured strategy."""
    run_server(grid, compose_from_run_config(context.run_config))
