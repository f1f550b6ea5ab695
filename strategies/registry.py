"""Strategies by name: validate their config before any work, then build them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from omegaconf import DictConfig, OmegaConf

from data.errors import ConfigError
from data.registry import check_int, check_number
from strategies.base import FederatedStrategy
from strategies.fedavg import FedAvg
from strategies.fedcorr import FedCorr, FedCorrSettings
from strategies.fedcorr_metrics import GroundTruth


def _check_fedavg(cfg: DictConfig) -> None:
    check_int("strategy.num_rounds", cfg.strategy.num_rounds, low=1)
    check_number("strategy.fraction", cfg.strategy.fraction, low=0.0, high=1.0, low_open=True)
    check_int("strategy.min_clients", cfg.strategy.min_clients, low=1)
    if cfg.strategy.min_clients > cfg.num_clients:
        raise ConfigError(
            f"strategy.min_clients={cfg.strategy.min_clients} exceeds num_clients={cfg.num_clients}"
        )


def _build_fedavg(cfg: DictConfig, rng: np.random.Generator, truth: GroundTruth | None) -> FedAvg:
    return FedAvg(num_rounds=cfg.strategy.num_rounds, fraction=cfg.strategy.fraction,
                  min_clients=cfg.strategy.min_clients, rng=rng, on_client_error=cfg.server.on_client_error)


_ABLATIONS = ("correction", "fraction_scheduling", "local_proximal", "finetuning", "usual_training", "mixup")
STAGE3_NAMES = ("fedavg",)


def _check_fedcorr(cfg: DictConfig) -> None:
    s = cfg.strategy
    check_int("strategy.t1", s.t1, low=1)
    check_int("strategy.t2", s.t2, low=0)
    check_int("strategy.t3", s.t3, low=0)
    if s.frac1 is not None:
        check_number("strategy.frac1", s.frac1, low=0.0, high=1.0, low_open=True)
    check_number("strategy.frac2", s.frac2, low=0.0, high=1.0, low_open=True)
    check_number("strategy.beta", s.beta, low=0.0)
    check_int("strategy.lid_k", s.lid_k, low=1)
    check_number("strategy.mixup_alpha", s.mixup_alpha, low=0.0)
    for key in ("pi", "theta", "kappa"):
        check_number(f"strategy.{key}", s[key], low=0.0, high=1.0)
    if s.prox_norm not in ("squared", "l2"):
        raise ConfigError(f"strategy.prox_norm={s.prox_norm!r} is invalid: allowed are squared, l2")
    if s.stage3 not in STAGE3_NAMES:
        raise ConfigError(f"strategy.stage3={s.stage3!r} is unknown: allowed are {', '.join(STAGE3_NAMES)}")
    unknown = sorted(set(s.ablation) - set(_ABLATIONS))
    if unknown:
        raise ConfigError(f"strategy.ablation has unknown keys {unknown}: allowed are {', '.join(_ABLATIONS)}")
    for key in _ABLATIONS:
        if not isinstance(s.ablation.get(key), bool):
            raise ConfigError(f"strategy.ablation.{key}={s.ablation.get(key)!r} is invalid: allowed is true or false")


def _build_fedcorr(cfg: DictConfig, rng: np.random.Generator, truth: GroundTruth | None) -> FedCorr:
    s = cfg.strategy
    settings = FedCorrSettings(
        t1=s.t1, t2=s.t2, t3=s.t3, frac1=s.frac1, frac2=s.frac2, beta=s.beta, prox_norm=s.prox_norm,
        lid_k=s.lid_k, mixup_alpha=s.mixup_alpha, pi=s.pi, theta=s.theta, kappa=s.kappa,
        **{key: bool(s.ablation[key]) for key in _ABLATIONS},
    )
    stage3 = FedAvg(num_rounds=s.t3, fraction=s.frac2, stage="usual", rng=rng,
                    on_client_error=cfg.server.on_client_error)
    return FedCorr(settings=settings, train=OmegaConf.to_container(s.train), stage3=stage3, seed=int(cfg.seed),
                   truth=truth, rng=rng, on_client_error=cfg.server.on_client_error)


_STRATEGIES: dict[str, tuple[Callable[[DictConfig], None], Callable[..., FederatedStrategy]]] = {
    "fedavg": (_check_fedavg, _build_fedavg),
    "fedcorr": (_check_fedcorr, _build_fedcorr),
}
STRATEGY_NAMES = tuple(_STRATEGIES)


def check_strategy(cfg: DictConfig) -> None:
    """The ``strategy`` block of the config: a known name and values in range."""
    if cfg.strategy.name not in _STRATEGIES:
        raise ConfigError(f"strategy={cfg.strategy.name!r} is unknown: allowed are {', '.join(STRATEGY_NAMES)}")
    _STRATEGIES[cfg.strategy.name][0](cfg)


def build_strategy(cfg: DictConfig, rng: np.random.Generator, truth: GroundTruth | None = None) -> FederatedStrategy:
    """The configured strategy (its config checked first). ``truth``: the simulated scene's ground
    truth, for methods that report detection metrics (None in a real deployment)."""
    check_strategy(cfg)
    return _STRATEGIES[cfg.strategy.name][1](cfg, rng, truth)
