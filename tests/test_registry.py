"""Strategies and client plug-ins are found by discovery, not by a list: each is one class in a file
named after it, with its conf file, and every plug-in's queries reach Flower."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from defaults import composed, context, strategy_settings

from client.app import app as client_app
from client.plugins.base import ClientPlugin
from client.plugins.registry import PLAIN, plugin, plugins
from common.errors import UNSET, InvalidValue
from common.validation import from_mapping
from settings.compose import compose_config, group_options
from strategies.base import FederatedStrategy
from strategies.fedavg import FedAvg
from strategies.fedcorr import FedCorrSettings, stage3_classes
from strategies.registry import StrategyPlan, names, plan_strategy, strategy_class, strategy_classes


def test_every_strategy_is_one_class_in_the_file_named_after_it_with_its_conf_file():
    assert names() and set(names()) <= set(group_options("strategy")), \
        "one conf/strategy/<name>.yaml per registered strategy"
    # Any other file is a variant of one (strategy=feddiv_code): <name>_<variant>.yaml, naming that strategy.
    for option in set(group_options("strategy")) - set(names()):
        name = compose_config([f"strategy={option}"]).strategy.name
        assert name in names() and option.startswith(f"{name}_"), f"conf/strategy/{option}.yaml is not a variant"
    for name, cls in strategy_classes().items():
        assert cls.__module__ == f"strategies.{name}"
        assert issubclass(cls, FederatedStrategy) and cls.name == name
    # A module's own strategy classes are all registered (none is shadowed by another name).
    for path in (Path(__file__).parents[1] / "strategies").glob("*.py"):
        module = importlib.import_module(f"strategies.{path.stem}")
        own = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, FederatedStrategy) and cls.__module__ == module.__name__ and "name" in vars(cls)]
        assert [cls.name for cls in own] in ([], [path.stem])


def test_an_unknown_strategy_is_refused_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"^strategy='fedmagic' is invalid: allowed are " + ", ".join(names())):
        strategy_class("fedmagic")


@pytest.mark.parametrize("name", list(stage3_classes()))
def test_every_round_based_strategy_can_be_fedcorrs_stage_3_with_the_conf_defaults(name: str):
    cls = stage3_classes()[name]
    assert issubclass(cls, FedAvg) and cls.stage3
    config = composed("strategy=fedcorr", f"strategy.stage3={name}")["strategy"]
    block = {k: v for k, v in config.items() if k != "name"}
    settings = from_mapping(FedCorrSettings, block, "strategy")
    assert type(settings.stage3_settings()) is cls.settings_type()


def test_strategies_with_stages_of_their_own_are_not_offered_as_stage_3():
    staged = {name for name, cls in strategy_classes().items() if not (issubclass(cls, FedAvg) and cls.stage3)}
    assert "fedcorr" in staged and staged.isdisjoint(stage3_classes())


def test_client_plugins_are_found_and_their_queries_registered_with_flower():
    found = plugins()
    assert found[""] is PLAIN and plugin("") is PLAIN
    for name, instance in found.items():
        assert isinstance(instance, ClientPlugin) and instance.name == name
        if name:  # a plug-in's messages live in its protocol module
            assert importlib.import_module(f"protocol.{name}").PLUGIN == name
    queries = {f"query.{action}" for instance in found.values() for action in instance.queries()}
    assert set(client_app._registered_funcs) == {"query.info", "query.held", "query.loss", "train.default",
                                                 "evaluate.default", *queries}
    with pytest.raises(ValueError, match="client plug-in 'fedmagic'; this node knows ''"):
        plugin("fedmagic")


def fedavg_block(**changes: object) -> dict[str, object]:
    """``conf/strategy/fedavg.yaml``'s block, name included, with ``changes``."""
    return {**composed("strategy=fedavg")["strategy"], **changes}


def test_a_planned_strategy_holds_the_named_class_and_its_checked_settings():
    plan = plan_strategy(fedavg_block(num_rounds=4, fraction=0.3), context(num_clients=10))
    assert isinstance(plan, StrategyPlan)
    assert plan.cls is FedAvg and plan.name == "fedavg"
    assert plan.settings == strategy_settings("fedavg", num_rounds=4, fraction=0.3)


def test_a_plan_builds_its_strategy_from_its_settings_and_the_running_servers_context():
    """The built strategy keeps the plan's settings and the given context; its rounds follow the
    context's budget: 7 participations in rounds of round(0.3 * 10) = 3 clients pay for 2 rounds."""
    plan = plan_strategy(fedavg_block(num_rounds=4, fraction=0.3), context(num_clients=10))
    running = context(num_clients=10, comm_budget=7)
    strategy = plan.build(running)
    assert type(strategy) is FedAvg and strategy.settings is plan.settings and strategy.context is running
    assert strategy.num_rounds == 2
    assert plan.build(context(num_clients=10)).num_rounds == 4


def test_a_block_without_a_name_is_refused_at_the_unset_strategy_name():
    block = {k: v for k, v in fedavg_block().items() if k != "name"}
    with pytest.raises(InvalidValue) as caught:
        plan_strategy(block, context())
    assert caught.value.key == "strategy.name" and caught.value.value is UNSET
    assert str(caught.value) == "strategy.name=<unset> is invalid: the config must name a strategy"


def test_a_run_check_that_fails_names_the_key_within_the_strategy_block():
    """The settings' run checks see the run's context (here its 10 clients) and name keys relative to
    their block; the plan re-issues them under ``strategy``."""
    plan_strategy(fedavg_block(min_clients=10), context(num_clients=10))
    with pytest.raises(InvalidValue) as caught:
        plan_strategy(fedavg_block(min_clients=10), context(num_clients=9))
    assert (caught.value.key, caught.value.value) == ("strategy.min_clients", 10)
    assert str(caught.value) == "strategy.min_clients=10 is invalid: allowed is at most num_clients=9"
