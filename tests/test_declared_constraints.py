"""Bad input generated from the declared constraints: for every option of every settings class the
config reaches (the run's, the data registries', each strategy's and each stage-3 block's), values
just outside each bound, a wrong option, a wrong type and null are refused before any work, in one
line that names the option by its full key and says what is allowed."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

import pytest
from defaults import composed

from common.errors import ConfigError
from common.validation import FLAT, MEANING, Constraint, constraints, nested_type
from data.noise import NOISE_MODELS
from data.partition import PARTITIONERS
from data.registry import Registry
from data.scene import DatasetSource
from data.transforms import TransformSpec
from server.config import load_run
from settings.run import LoggingSettings, RunSettings, ServerSettings, SimulationSettings
from strategies.fedcorr import stage3_classes
from strategies.registry import strategy_classes
from strategies.rounds import RoundSettings

RUN_BLOCKS = {"server": ServerSettings, "logging": LoggingSettings, "simulation": SimulationSettings,
              "dataset": DatasetSource, "dataset.transforms.train": TransformSpec,
              "dataset.transforms.eval": TransformSpec}


def declared(cls: type, block: Mapping[str, Any], path: str, skip: frozenset[str] = frozenset()
             ) -> Iterator[tuple[str, Constraint, tuple[type, str]]]:
    """(full key, constraint, (declaring class, field)) of every declared option of ``cls`` that
    ``block`` sets, nested ones too."""
    own = constraints(cls)
    for spec in fields(cls):
        if spec.name in skip:
            continue
        inner = nested_type(cls, spec)
        if inner is not None and spec.metadata.get(FLAT):
            yield from declared(inner, block, path)
        elif spec.name not in block:
            continue
        elif inner is not None and isinstance(block[spec.name], Mapping):
            yield from declared(inner, block[spec.name], f"{path}.{spec.name}")
        elif spec.name in own:
            yield f"{path}.{spec.name}", own[spec.name], (cls, spec.name)


def at(config: Mapping[str, Any], path: str) -> Any:
    for part in path.split("."):
        config = config[part]
    return config


def options() -> Iterator[tuple[tuple[str, ...], str, Constraint]]:
    """(overrides of the base config, full key, constraint) for every declared option, once per
    declaration (a settings class several blocks share, as the train block, is tested in the first)."""
    base = composed()
    found: list[tuple[tuple[str, ...], str, Constraint, tuple[type, str]]] = []
    for path, cls in RUN_BLOCKS.items():
        found += [((), *option) for option in declared(cls, at(base, path), path)]
    found += [((), key, constraint, (RunSettings, key)) for key, constraint in constraints(RunSettings).items()
              if key in base]
    for kind, registry in (("partition", PARTITIONERS), ("noise", NOISE_MODELS)):
        for name in registry.names:
            found += [((f"{kind}={name}",), f"{kind}.{key}", constraint, (Registry, f"{kind}={name}.{key}"))
                      for key, constraint in registry.rules(name).items()]
    for name, cls in strategy_classes().items():
        overrides = (f"strategy={name}",)
        found += [(overrides, *option) for option in declared(cls.settings_type(), composed(*overrides)["strategy"],
                                                             "strategy")]
    schedule = frozenset(spec.name for spec in fields(RoundSettings))
    blocks = composed("strategy=fedcorr")["strategy"]["stage3_options"]
    for name, cls in stage3_classes().items():  # the same options, reached through FedCorr's block
        found += [((f"strategy.stage3={name}",), key, constraint, (owner, f"stage3.{field}"))
                  for key, constraint, (owner, field) in declared(cls.settings_type(), blocks.get(name) or {},
                                                                  f"strategy.stage3_options.{name}", skip=schedule)]
    seen: set[tuple[type, str]] = set()
    for overrides, key, constraint, declaration in found:
        if declaration not in seen:
            seen.add(declaration)
            yield overrides, key, constraint


CASES = [pytest.param(overrides, key, value, constraint, id=f"{' '.join(overrides)} {key}={value!r}")
         for overrides, key, constraint in options() for value in constraint.invalid()]


def settings_classes() -> set[type]:
    """Every settings class the config reaches: the run's blocks and each strategy's, nested ones too."""
    found: set[type] = set()

    def walk(cls: type) -> None:
        found.add(cls)
        for spec in fields(cls):
            inner = nested_type(cls, spec)
            if inner is not None and inner not in found:
                walk(inner)

    for cls in (RunSettings, *RUN_BLOCKS.values(), *(c.settings_type() for c in strategy_classes().values())):
        walk(cls)
    return found


def test_every_option_of_every_settings_class_declares_its_meaning():
    missing = [f"{cls.__name__}.{spec.name}" for cls in settings_classes() for spec in fields(cls)
               if spec.init and spec.name != "resolved" and not spec.metadata.get(MEANING)]
    assert missing == []


def test_the_generated_cases_reach_every_strategy_and_the_run():
    keys = {key for _, key, _, _ in (case.values for case in CASES)}
    assert {"server.round_timeout", "simulation.num_cpus_per_client", "dataset.transforms.train.crop",
            "partition.alpha", "noise.rho", "seed", "strategy.train.lr", "strategy.train.lsr.gamma",
            "strategy.ablation.mixup", "strategy.stage3_options.poc.d"} <= keys
    # Every strategy with options of its own beyond FedAvg's schedule and local training.
    for name, cls in strategy_classes().items():
        if set(constraints(cls.settings_type())) - set(constraints(RoundSettings)):
            assert any(overrides == (f"strategy={name}",) for overrides, _, _, _ in (c.values for c in CASES)), name


@pytest.mark.parametrize(("overrides", "key", "value", "constraint"), CASES)
def test_each_declared_option_refuses_what_its_constraint_refuses(overrides, key, value, constraint):
    config = copy.deepcopy(composed(*overrides))
    parent, _, leaf = key.rpartition(".")
    (at(config, parent) if parent else config)[leaf] = value
    with pytest.raises(ConfigError) as caught:
        load_run(config)
    assert str(caught.value) == f"{key}={value!r} is invalid: {constraint.allowed()}"
