"""Strategies by name: validate their config before any work, then build them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from omegaconf import DictConfig

from data.errors import ConfigError
from data.registry import check_int, check_number
from strategies.base import FederatedStrategy
from strategies.fedavg import FedAvg


def _check_fedavg(cfg: DictConfig) -> None:
    check_int("strategy.num_rounds", cfg.strategy.num_rounds, low=1)
    check_number("strategy.fraction", cfg.strategy.fraction, low=0.0, high=1.0, low_open=True)
    check_int("strategy.min_clients", cfg.strategy.min_clients, low=1)
    if cfg.strategy.min_clients > cfg.num_clients:
        raise ConfigError(
            f"strategy.min_clients={cfg.strategy.min_clients} exceeds num_clients={cfg.num_clients}"
        )


def _build_fedavg(cfg: DictConfig, rng: np.random.Generator) -> FedAvg:
    return FedAvg(fraction=cfg.strategy.fraction, min_clients=cfg.strategy.min_clients, rng=rng,
                  on_client_error=cfg.server.on_client_error)


_STRATEGIES: dict[str, tuple[Callable[[DictConfig], None], Callable[..., FederatedStrategy]]] = {
    "fedavg": (_check_fedavg, _build_fedavg),
}
STRATEGY_NAMES = tuple(_STRATEGIES)


def check_strategy(cfg: DictConfig) -> None:
    """The ``strategy`` block of the config: a known name and values in range."""
    if cfg.strategy.name not in _STRATEGIES:
        raise ConfigError(f"strategy={cfg.strategy.name!r} is unknown: allowed are {', '.join(STRATEGY_NAMES)}")
    _STRATEGIES[cfg.strategy.name][0](cfg)


def build_strategy(cfg: DictConfig, rng: np.random.Generator) -> FederatedStrategy:
    """The configured strategy (its config checked first)."""
    check_strategy(cfg)
    return _STRATEGIES[cfg.strategy.name][1](cfg, rng)
