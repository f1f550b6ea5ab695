"""Strategies by name, found in this package: a module that defines ``STRATEGY`` registers it.

A new method adds its module (with its ``STRATEGY`` entry) and its ``conf/strategy/<name>.yaml``;
nothing here changes. ``parse`` checks a strategy's config block once into its typed settings (before
any work), ``build`` makes the strategy from them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import UNSET, ConfigError, InvalidValue
from common.validation import Integer, dataclass_kwargs, settings_from_mapping
from strategies.base import FederatedStrategy
from strategies.environment import Environment
from strategies.rounds import RoundSettings
from task.local_training import LocalTraining

# The ``train`` block's nested option blocks (``lsr``, ``sce``, ``coteaching``): its dataclass fields.
LEARNER_OPTIONS: dict[str, type] = {
    name: hint for name, hint in typing.get_type_hints(LocalTraining).items() if isinstance(hint, type)
    and is_dataclass(hint)}


@dataclass(frozen=True)
class StrategyEntry:
    """A registered strategy.

    name: its config name (``strategy=<name>``).
    parse: (its config block without ``name``, the block's key prefix) -> its typed settings.
    check: (settings, environment) -> None; checks that need the federation (size, budget).
    build: (settings, environment, rng) -> the strategy.
    round_method: a ``RoundMethod`` when the strategy is round-based (usable as FedCorr's stage 3).
    min_client_samples: the fewest samples a client may hold (FedCorr's LID needs a neighbour,
        FedDiv's filter two losses); checked against the scene before the run starts.
    """

    name: str
    parse: Callable[[Mapping[str, Any], str], Any]
    check: Callable[[Any, Environment], None]
    build: Callable[[Any, Environment, np.random.Generator], FederatedStrategy]
    round_method: RoundMethod | None = None
    min_client_samples: int = 1


@dataclass(frozen=True)
class RoundMethod:
    """A round-based strategy: FedAvg's schedule plus the method's own options dataclass.

    options: the options dataclass (``conf/strategy/method/<name>.yaml``; no fields: none).
    cls: the strategy class; it takes FedAvg's arguments and one keyword per option.
    extra: (options, environment) -> further keyword arguments of ``cls`` (default: the options).
    check: (options, round size, environment, key) -> None; option checks that need the federation.
    learner: the learner the method always trains with (FedLSR's ``lsr``); None: the ``train`` block's.
    two_networks: whether it works with a learner that trains two networks (Co-teaching).
    """

    options: type
    cls: Callable[..., FederatedStrategy]
    extra: Callable[[Any, Environment], dict[str, Any]] | None = None
    check: Callable[[Any, int, Environment, str], None] | None = None
    learner: str | None = None
    two_networks: bool = True

    def training(self, train: LocalTraining) -> LocalTraining:
        """The local training the method's clients do, from the ``train`` block's."""
        return train if self.learner is None else train.but(learner=self.learner)

    def check_learner(self, train: LocalTraining, name: str, key: str) -> None:
        """Refuse a learner the method cannot train with (``key``: where the learner was set)."""
        if self.learner is not None and train.learner not in ("ce", self.learner):
            raise ConfigError(f"{key}={train.learner} is invalid: {name} trains with learner {self.learner}")
        if self.training(train).peers and not self.two_networks:
            raise ConfigError(f"{key}={train.learner} is invalid: {name} works with one network; "
                              "a learner that trains two (coteaching) needs another strategy")

    def make(self, rounds: RoundSettings, options: Any, env: Environment, rng: np.random.Generator,
             *, stage: str, num_rounds: int) -> FederatedStrategy:
        """The strategy for ``num_rounds`` rounds of ``rounds``' schedule, logging them as ``stage``."""
        extra = asdict(options) if self.extra is None else self.extra(options, env)
        return self.cls(num_rounds=num_rounds, fraction=rounds.fraction, min_clients=rounds.min_clients,
                        train=self.training(rounds.train), stage=stage, new_network=env.new_network, rng=rng,
                        skip_failed=env.skip_failed, **extra)

    def parse_options(self, cfg: Mapping[str, Any], prefix: str) -> Any:
        """The options dataclass from ``cfg`` (keys that are not options are ignored)."""
        names = {spec.name for spec in fields(self.options)}
        return settings_from_mapping(self.options, {k: v for k, v in cfg.items() if k in names}, prefix)


@dataclass(frozen=True)
class RoundMethodSettings:
    """A standalone round-based strategy's settings: its schedule and its options."""

    rounds: RoundSettings
    options: Any


def parse_training(cfg: Mapping[str, Any], prefix: str) -> LocalTraining:
    """The ``train`` block of a strategy config as ``LocalTraining``, the learners' options included."""
    if "train" not in cfg:
        raise InvalidValue(f"{prefix}.train", UNSET, "the strategy needs its local training settings")
    train, key = cfg["train"], f"{prefix}.train"
    if not isinstance(train, Mapping):
        raise InvalidValue(key, train, "a mapping of local training settings")
    options: dict[str, Any] = {name: settings_from_mapping(kind, train.get(name) or {}, f"{key}.{name}")
                               for name, kind in LEARNER_OPTIONS.items()}
    return settings_from_mapping(LocalTraining, train, key, **options)


def round_entry(name: str, method: RoundMethod) -> StrategyEntry:
    """The registry entry of a round-based strategy, standalone (``strategy=<name>``)."""
    option_names = {spec.name for spec in fields(method.options)}
    round_names = {spec.name for spec in fields(RoundSettings)}

    def parse(cfg: Mapping[str, Any], prefix: str) -> RoundMethodSettings:
        dataclass_kwargs(prefix, {k: v for k, v in cfg.items() if k not in option_names}, RoundSettings)
        try:
            Integer(low=1).check("num_rounds", cfg.get("num_rounds"))
        except InvalidValue as err:
            raise err.under(prefix) from None
        rounds = settings_from_mapping(RoundSettings, {k: v for k, v in cfg.items() if k in round_names},
                                       prefix, train=parse_training(cfg, prefix))
        return RoundMethodSettings(rounds, method.parse_options(cfg, prefix))

    def check(settings: RoundMethodSettings, env: Environment) -> None:
        settings.rounds.check_for(env.num_clients, env.comm_budget, "strategy")
        method.check_learner(settings.rounds.train, name, "strategy.train.learner")
        if method.check is not None:
            method.check(settings.options, settings.rounds.round_size(env.num_clients), env, "strategy")

    def build(settings: RoundMethodSettings, env: Environment, rng: np.random.Generator) -> FederatedStrategy:
        rounds = settings.rounds
        return method.make(rounds, settings.options, env, rng, stage=name,
                           num_rounds=rounds.rounds_under(env.comm_budget, env.num_clients))

    return StrategyEntry(name, parse, check, build, method)


@functools.cache
def entries() -> dict[str, StrategyEntry]:
    """Every registered strategy by name (the modules of this package that define ``STRATEGY``)."""
    found: dict[str, StrategyEntry] = {}
    for module in sorted(info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])):
        entry = getattr(importlib.import_module(f"strategies.{module}"), "STRATEGY", None)
        if isinstance(entry, StrategyEntry):
            found[entry.name] = entry
    return found


def names() -> tuple[str, ...]:
    """The registered strategy names."""
    return tuple(entries())


def entry(name: Any, key: str = "strategy") -> StrategyEntry:
    """The entry of ``name``; an unknown name is a ConfigError listing the known ones."""
    if not isinstance(name, str) or name not in entries():
        raise ConfigError(f"{key}={name!r} is invalid: allowed are {', '.join(names())}")
    return entries()[name]


def round_method(name: Any, key: str) -> RoundMethod:
    """The round-based method ``name`` (a stage-3 strategy of FedCorr)."""
    allowed = [n for n, e in entries().items() if e.round_method is not None]
    if not isinstance(name, str) or name not in allowed:
        raise ConfigError(f"{key}={name!r} is invalid: allowed are {', '.join(allowed)}")
    method = entries()[name].round_method
    assert method is not None
    return method


@dataclass(frozen=True)
class StrategyPlan:
    """A strategy's checked settings, ready to build: ``build_strategy(plan, env, rng)``."""

    name: str
    settings: Any


def parse_strategy(cfg: Mapping[str, Any], env: Environment) -> StrategyPlan:
    """Check the ``strategy`` config block (a plain mapping with ``name``) once, before any work."""
    if "name" not in cfg:
        raise InvalidValue("strategy.name", UNSET, "the config must name a strategy")
    found = entry(cfg["name"])
    settings = found.parse({k: v for k, v in cfg.items() if k != "name"}, "strategy")
    found.check(settings, env)
    return StrategyPlan(found.name, settings)


def build_strategy(plan: StrategyPlan, env: Environment, rng: np.random.Generator) -> FederatedStrategy:
    """The strategy of a checked plan."""
    return entry(plan.name).build(plan.settings, env, rng)
