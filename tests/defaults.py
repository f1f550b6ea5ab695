"""Settings as ``conf/`` gives them, for tests that build objects directly: ``conf/`` is the single
source of defaults, so a test names only what it changes."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import numpy as np

from common.validation import from_mapping
from settings.compose import compose_config
from settings.scene import resolved
from strategies.base import StrategySettings
from strategies.context import StrategyContext
from strategies.registry import strategy_class
from task.learner_settings import CoteachingSettings, LsrSettings, SceSettings
from task.local_training import LocalTraining


@functools.cache
def composed(*overrides: str) -> dict[str, Any]:
    """The resolved config of ``overrides``."""
    return resolved(compose_config(list(overrides)))


def noise_params(name: str, **changes: Any) -> dict[str, Any]:
    """``conf/noise/<name>.yaml``'s parameters (without ``name``), with ``changes``."""
    block = {key: value for key, value in composed(f"noise={name}")["noise"].items() if key != "name"}
    return {**block, **changes}


def local_training(**changes: Any) -> LocalTraining:
    """``conf/strategy/local/sgd.yaml``'s local training, with ``changes``."""
    train = from_mapping(LocalTraining, composed("strategy=fedavg")["strategy"]["train"], "strategy.train")
    return train.but(**changes)


def lsr_settings(**changes: Any) -> LsrSettings:
    """The lsr learner's settings from ``conf/``, with ``changes``."""
    return replace(local_training().lsr, **changes)


def sce_settings(**changes: Any) -> SceSettings:
    """The sce learner's settings from ``conf/``, with ``changes``."""
    return replace(local_training().sce, **changes)


def coteaching_settings(**changes: Any) -> CoteachingSettings:
    """The coteaching learner's settings from ``conf/``, with ``changes``."""
    return replace(local_training().coteaching, **changes)


def strategy_settings(name: str, *overrides: str, **changes: Any) -> Any:
    """Strategy ``name``'s settings as ``conf/`` composes them with ``overrides``, then ``changes``."""
    block = {k: v for k, v in composed(f"strategy={name}", *overrides)["strategy"].items() if k != "name"}
    settings = from_mapping(strategy_class(name).settings_type(), block, "strategy")
    assert isinstance(settings, StrategySettings)
    return replace(settings, **changes)


def context(num_clients: int = 10, seed: int = 1, rng: int = 0, **known: Any) -> StrategyContext:
    """A strategy's context for a federation of ``num_clients``, sampling from ``default_rng(rng)``."""
    return StrategyContext(num_clients=num_clients, seed=seed, rng=np.random.default_rng(rng), **known)
