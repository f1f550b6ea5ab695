"""The Flower ServerApp: ``serverapp = "server.app:app"`` in pyproject.toml."""

from __future__ import annotations

import sys

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.config import load_run
from server.discovery import DiscoveryError
from server.progress import closing_lines
from server.run import run_server
from settings.compose import COMMAND_KEY, RUN_CONFIG_KEY, compose_from_run_config

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Compose the Hydra config from the run config's overrides, check it once, run the strategy."""
    command = context.run_config.get(COMMAND_KEY)
    try:
        payload = run_server(grid, load_run(compose_from_run_config(context.run_config)),
                             command=None if command is None else str(command),
                             overrides=str(context.run_config.get(RUN_CONFIG_KEY, "")))
    except DiscoveryError as err:
        # The federation is not what the config says (its size, its partitions): one line saying what to
        # change, not a traceback through Flower's runner.
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(closing_lines(payload), flush=True)
