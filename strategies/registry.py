"""Strategies by name: validate their config before any work, then build them.

The round-based strategies (FedAvg, FedProx, FedDyn, FedMedian, Power-of-Choice) run standalone as
``strategy=<name>`` and as FedCorr's stage 3 (``strategy=fedcorr strategy.stage3=<name>``); their
method hyperparameters come from conf/strategy/method/<name>.yaml in both cases.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from data.errors import ConfigError
from data.registry import check_int, check_number
from strategies.base import FederatedStrategy
from strategies.fedavg import FedAvg
from strategies.fedcorr import FedCorr, FedCorrSettings
from strategies.fedcorr_metrics import GroundTruth
from strategies.feddyn import FedDyn
from strategies.fedmedian import FedMedian
from strategies.fedprox import FedProx
from strategies.poc import PowerOfChoice
from strategies.utils import round_size


def _no_options(name: str, options: Mapping[str, Any], round_clients: int, num_clients: int) -> None:
    return None


def _check_fedprox(name: str, options: Mapping[str, Any], round_clients: int, num_clients: int) -> None:
    check_number(f"{name}.mu", options.get("mu"), low=0.0)


def _check_feddyn(name: str, options: Mapping[str, Any], round_clients: int, num_clients: int) -> None:
    check_number(f"{name}.alpha", options.get("alpha"), low=0.0, low_open=True)
    check_number(f"{name}.lr_decay", options.get("lr_decay"), low=0.0, high=1.0, low_open=True)


def _check_poc(name: str, options: Mapping[str, Any], round_clients: int, num_clients: int) -> None:
    check_int(f"{name}.d", options.get("d"), low=1)
    if not round_clients <= options["d"] <= num_clients:
        raise ConfigError(
            f"{name}.d={options['d']} is invalid: allowed is between the clients per round ({round_clients}) "
            f"and num_clients ({num_clients})"
        )


_ROUND_STRATEGIES: dict[str, tuple[Callable[..., None], type[FedAvg], tuple[str, ...]]] = {
    "fedavg": (_no_options, FedAvg, ()),
    "fedprox": (_check_fedprox, FedProx, ("mu",)),
    "feddyn": (_check_feddyn, FedDyn, ("alpha", "lr_decay")),
    "fedmedian": (_no_options, FedMedian, ()),
    "poc": (_check_poc, PowerOfChoice, ("d",)),
}
STAGE3_NAMES = tuple(_ROUND_STRATEGIES)


def build_round_strategy(
    name: str,
    options: Mapping[str, Any],
    *,
    num_rounds: int,
    fraction: float,
    min_clients: int,
    stage: str,
    rng: np.random.Generator,
    cfg: DictConfig,
    parameter_names: Collection[str],
) -> FedAvg:
    """A FedAvg-family strategy by name, with its method options (already checked)."""
    _, cls, keys = _ROUND_STRATEGIES[name]
    extra: dict[str, Any] = {key: options[key] for key in keys}
    if name == "feddyn":
        extra["parameter_names"] = parameter_names
    if name == "poc":
        extra["timeout"] = float(cfg.server.round_timeout)
    return cls(num_rounds=num_rounds, fraction=fraction, min_clients=min_clients, stage=stage, rng=rng,
               on_client_error=cfg.server.on_client_error, **extra)


def _budget_rounds(cfg: DictConfig, spent: int, per_round: int, what: str) -> int | None:
    """Rounds that spend ``comm_budget`` (client participations) after ``spent``; None without a budget."""
    budget = cfg.get("comm_budget")
    if budget is None:
        return None
    check_int("comm_budget", budget, low=1)
    if budget < spent:
        raise ConfigError(f"comm_budget={budget} is too small: {what} alone spend {spent} client participations")
    return (budget - spent) // per_round


def _num_rounds(cfg: DictConfig) -> int:
    s = cfg.strategy
    rounds = _budget_rounds(cfg, 0, round_size(s.fraction, cfg.num_clients, s.min_clients), s.name)
    return s.num_rounds if rounds is None else rounds


def _check_rounds(cfg: DictConfig) -> None:
    s = cfg.strategy
    check_int("strategy.num_rounds", s.num_rounds, low=1)
    check_number("strategy.fraction", s.fraction, low=0.0, high=1.0, low_open=True)
    check_int("strategy.min_clients", s.min_clients, low=1)
    if s.min_clients > cfg.num_clients:
        raise ConfigError(f"strategy.min_clients={s.min_clients} exceeds num_clients={cfg.num_clients}")
    checker = _ROUND_STRATEGIES[s.name][0]
    checker("strategy", s, round_size(s.fraction, cfg.num_clients, s.min_clients), cfg.num_clients)
    if _num_rounds(cfg) < 1:
        raise ConfigError(f"comm_budget={cfg.comm_budget} is too small: one {s.name} round spends "
                          f"{round_size(s.fraction, cfg.num_clients, s.min_clients)} client participations")


def _build_rounds(cfg: DictConfig, rng: np.random.Generator, truth: GroundTruth | None,
                  parameter_names: Collection[str]) -> FedAvg:
    s = cfg.strategy
    return build_round_strategy(s.name, s, num_rounds=_num_rounds(cfg), fraction=s.fraction, min_clients=s.min_clients,
                                stage=s.name, rng=rng, cfg=cfg, parameter_names=parameter_names)


_ABLATIONS = ("correction", "fraction_scheduling", "local_proximal", "finetuning", "usual_training", "mixup")


def _fedcorr_t3(cfg: DictConfig) -> int:
    """T3, or with ``comm_budget`` the stage-3 rounds left after stage 1 (T1 * N) and stage 2 (T2 * m)."""
    s = cfg.strategy
    per_round = round_size(s.frac2, cfg.num_clients)
    finetuning = s.t2 * per_round if s.ablation.get("finetuning", True) else 0
    rounds = _budget_rounds(cfg, s.t1 * cfg.num_clients + finetuning, per_round, "FedCorr's stages 1-2")
    return s.t3 if rounds is None else rounds


def _check_fedcorr(cfg: DictConfig) -> None:
    s = cfg.strategy
    check_int("strategy.t1", s.t1, low=1)
    check_int("strategy.t2", s.t2, low=0)
    check_int("strategy.t3", s.t3, low=0)
    _fedcorr_t3(cfg)
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
    options = s.stage3_options.get(s.stage3, {})
    _ROUND_STRATEGIES[s.stage3][0](f"strategy.stage3_options.{s.stage3}", options,
                                   round_size(s.frac2, cfg.num_clients), cfg.num_clients)
    unknown = sorted(set(s.ablation) - set(_ABLATIONS))
    if unknown:
        raise ConfigError(f"strategy.ablation has unknown keys {unknown}: allowed are {', '.join(_ABLATIONS)}")
    for key in _ABLATIONS:
        if not isinstance(s.ablation.get(key), bool):
            raise ConfigError(f"strategy.ablation.{key}={s.ablation.get(key)!r} is invalid: allowed is true or false")


def _build_fedcorr(cfg: DictConfig, rng: np.random.Generator, truth: GroundTruth | None,
                   parameter_names: Collection[str]) -> FedCorr:
    s = cfg.strategy
    settings = FedCorrSettings(
        t1=s.t1, t2=s.t2, t3=s.t3, frac1=s.frac1, frac2=s.frac2, beta=s.beta, prox_norm=s.prox_norm,
        lid_k=s.lid_k, mixup_alpha=s.mixup_alpha, pi=s.pi, theta=s.theta, kappa=s.kappa,
        **{key: bool(s.ablation[key]) for key in _ABLATIONS},
    )
    stage3 = build_round_strategy(s.stage3, s.stage3_options.get(s.stage3, {}), num_rounds=_fedcorr_t3(cfg), fraction=s.frac2,
                                  min_clients=1, stage="usual", rng=rng, cfg=cfg, parameter_names=parameter_names)
    return FedCorr(settings=settings, train=OmegaConf.to_container(s.train), stage3=stage3, seed=int(cfg.seed),
                   truth=truth, rng=rng, on_client_error=cfg.server.on_client_error)


_STRATEGIES: dict[str, tuple[Callable[[DictConfig], None], Callable[..., FederatedStrategy]]] = {
    **{name: (_check_rounds, _build_rounds) for name in _ROUND_STRATEGIES},
    "fedcorr": (_check_fedcorr, _build_fedcorr),
}
STRATEGY_NAMES = tuple(_STRATEGIES)


def check_strategy(cfg: DictConfig) -> None:
    """The ``strategy`` block of the config: a known name and values in range."""
    if cfg.strategy.name not in _STRATEGIES:
        raise ConfigError(f"strategy={cfg.strategy.name!r} is unknown: allowed are {', '.join(STRATEGY_NAMES)}")
    _STRATEGIES[cfg.strategy.name][0](cfg)


def build_strategy(
    cfg: DictConfig,
    rng: np.random.Generator,
    truth: GroundTruth | None = None,
    parameter_names: Collection[str] = (),
) -> FederatedStrategy:
    """The configured strategy (its config checked first). ``truth``: the simulated scene's ground
    truth, for methods that report detection metrics (None in a real deployment).
    ``parameter_names``: the model's trainable parameter keys (FedDyn corrects only those)."""
    check_strategy(cfg)
    return _STRATEGIES[cfg.strategy.name][1](cfg, rng, truth, parameter_names)
