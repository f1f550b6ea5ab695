"""Validate a whole run's configuration before Ray, any node or any file is started."""

from __future__ import annotations

from omegaconf import DictConfig

from client.training import TrainConfig
from data.errors import ConfigError
from data.registry import check_int, check_number
from data.scene import scene_spec
from strategies.base import ON_CLIENT_ERROR
from strategies.registry import check_strategy


def check_run_config(cfg: DictConfig) -> None:
    """One ConfigError naming the first bad value and what is allowed; silent when all is well."""
    scene_spec(cfg)
    check_strategy(cfg)
    TrainConfig.from_mapping(cfg.strategy.train)
    if cfg.server.on_client_error not in ON_CLIENT_ERROR:
        raise ConfigError(f"server.on_client_error={cfg.server.on_client_error!r} is invalid: "
                          f"allowed are {', '.join(ON_CLIENT_ERROR)}")
    check_int("server.eval_every", cfg.server.eval_every, low=1)
    check_int("server.eval_batch_size", cfg.server.eval_batch_size, low=1)
    check_number("server.node_wait_timeout", cfg.server.node_wait_timeout, low=0.0, low_open=True)
    check_number("server.round_timeout", cfg.server.round_timeout, low=0.0, low_open=True)
    check_number("simulation.num_cpus_per_client", cfg.simulation.num_cpus_per_client, low=0.0, low_open=True)
    check_number("simulation.num_gpus_per_client", cfg.simulation.num_gpus_per_client, low=0.0)
