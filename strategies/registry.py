"""Strategies by name, found in this package: every class of a module here that declares its own
``name`` registers itself.

A new method adds its module and its ``conf/strategy/<name>.yaml``; nothing here changes.
``plan_strategy`` checks a strategy's config block once into its typed settings (before any work);
``StrategyPlan.build`` makes the strategy from them and the running server's context.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UNSET, ConfigError, InvalidValue
from common.validation import from_mapping
from strategies.base import FederatedStrategy, StrategySettings
from strategies.context import StrategyContext


@functools.cache
def strategy_classes() -> dict[str, type[FederatedStrategy]]:
    """Every registered strategy class by name, in name order."""
    found: dict[str, type[FederatedStrategy]] = {}
    for module_name in sorted(info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])):
        module = importlib.import_module(f"strategies.{module_name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, FederatedStrategy) and cls.__module__ == module.__name__ and "name" in vars(cls):
                found[cls.name] = cls
    return dict(sorted(found.items()))


def names() -> tuple[str, ...]:
    """The registered strategy names."""
    return tuple(strategy_classes())


def strategy_class(name: Any) -> type[FederatedStrategy]:
    """The class registered as ``name``; another name is a ConfigError listing the registered ones."""
    if not isinstance(name, str) or name not in strategy_classes():
        raise ConfigError(f"strategy={name!r} is invalid: allowed are {', '.join(names())}")
    return strategy_classes()[name]


@dataclass(frozen=True)
class StrategyPlan:
    """A strategy's class and its checked settings, ready to build."""

    cls: type[FederatedStrategy]
    settings: StrategySettings

    @property
    def name(self) -> str:
        """The strategy's registered name."""
        return self.cls.name

    def build(self, context: StrategyContext) -> FederatedStrategy:
        """The strategy, from its settings and the running server's context."""
        return self.cls(self.settings, context)


def plan_strategy(cfg: Mapping[str, Any], context: StrategyContext) -> StrategyPlan:
    """Check the ``strategy`` config block (a plain mapping with ``name``) once, before any work: its
    options, then what needs the run."""
    if "name" not in cfg:
        raise InvalidValue("strategy.name", UNSET, "the config must name a strategy")
    cls = strategy_class(cfg["name"])
    settings = from_mapping(cls.settings_type(), {k: v for k, v in cfg.items() if k != "name"}, "strategy")
    try:
        cls.check_run(settings, context)
    except InvalidValue as err:
        raise err.under("strategy") from None
    return StrategyPlan(cls, settings)
