"""Check a composed configuration once, before any work, into the typed settings of a whole run.

``sim.py`` and the ServerApp call ``load_run``; the ClientApp needs only ``settings.run``. Raises one
ConfigError naming the first bad value and what is allowed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from common.errors import InvalidValue
from common.folders import check_output_folder
from common.seeding import rng_for
from settings.run import RunSettings, run_settings
from settings.scene import resolved
from strategies.context import StrategyContext
from strategies.registry import StrategyPlan, plan_strategy
from task.device import check_device


@dataclass(frozen=True)
class RunPlan:
    """A checked run: its settings and its strategy's."""

    settings: RunSettings
    strategy: StrategyPlan

    def context(self, **known: Any) -> StrategyContext:
        """The strategy's context; ``known`` adds what only the running server knows (the model's
        parameter names, the scene's ground truth, the second network's initialiser)."""
        return strategy_context(self.settings, **known)


def strategy_context(settings: RunSettings, **known: Any) -> StrategyContext:
    """The strategies' view of the run's settings, with a fresh client-sampling generator."""
    return StrategyContext(num_clients=settings.num_clients, seed=settings.seed,
                           rng=rng_for(settings.seed, "client-sampling"), comm_budget=settings.comm_budget,
                           skip_failed=settings.server.on_client_error == "skip",
                           iid=settings.scene.partition.name == "iid", ground_truth=settings.ground_truth, **known)


def check_server_extras(settings: RunSettings) -> None:
    """What the server needs installed for the run's settings (a client node needs none of it)."""
    if settings.logging.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise InvalidValue("logging.tensorboard", True, 'true needs the tensorboard package: '
                           '.venv/bin/python -m pip install -e ".[tensorboard]"')


def load_run(cfg: DictConfig | dict[str, Any]) -> RunPlan:
    """The run's settings and its strategy's, every value checked: also that the server can write
    its out_dir and has the device it evaluates on."""
    settings = run_settings(cfg)
    check_output_folder("out_dir", settings.out_dir)
    check_device("server.device", settings.server.device)
    check_server_extras(settings)
    strategy = resolved(cfg)["strategy"]
    return RunPlan(settings, plan_strategy(strategy, strategy_context(settings)))
