"""Check a composed configuration once, before any work, into the typed settings of a whole run.

``sim.py`` and the ServerApp call ``load_run``; the ClientApp needs only ``settings.run``. Raises one
ConfigError naming the first bad value and what is allowed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from common.errors import InvalidValue
from common.folders import check_output_folder
from settings.run import RunSettings, run_settings
from strategies.environment import Environment
from strategies.registry import StrategyPlan, parse_strategy
from task.device import check_device


@dataclass(frozen=True)
class RunPlan:
    """A checked run: its settings and its strategy's."""

    settings: RunSettings
    strategy: StrategyPlan

    def environment(self, **known: Any) -> Environment:
        """What the strategy is built with; ``known`` adds what only the running server knows
        (the model's parameter names, the scene's ground truth)."""
        return environment(self.settings, **known)


def environment(settings: RunSettings, **known: Any) -> Environment:
    """The strategies' view of the run's settings."""
    return Environment(num_clients=settings.num_clients, seed=settings.seed, comm_budget=settings.comm_budget,
                       skip_failed=settings.server.on_client_error == "skip",
                       iid=settings.scene.partition.name == "iid", ground_truth=settings.ground_truth, **known)


def check_server_extras(settings: RunSettings) -> None:
    """What the server needs installed for the run's settings (a client node needs none of it)."""
    if settings.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise InvalidValue("logging.tensorboard", True, 'true needs the tensorboard package: '
                           '.venv/bin/python -m pip install -e ".[tensorboard]"')


def load_run(cfg: DictConfig) -> RunPlan:
    """The run's settings and its strategy's, every value checked: also that the server can write
    its out_dir and has the device it evaluates on."""
    settings = run_settings(cfg)
    check_output_folder("out_dir", settings.out_dir)
    check_device("server.device", settings.server.device)
    check_server_extras(settings)
    strategy_cfg = OmegaConf.to_container(cfg.strategy, resolve=True)
    assert isinstance(strategy_cfg, dict)
    strategy = {str(key): value for key, value in strategy_cfg.items()}
    return RunPlan(settings, parse_strategy(strategy, environment(settings)))
