"""Strategies and client plug-ins are found by name; each strategy has its config file."""

from __future__ import annotations

from client.app import app as client_app
from client.plugins import PLAIN, client_method, client_methods
from settings.compose import group_options
from strategies.registry import entries, names, round_method


def test_every_strategy_module_registers_under_its_config_name():
    assert names() == ("fedavg", "fedcorr", "feddiv", "feddyn", "fedes", "fedlsr", "fedmedian", "fednoro", "fedprox",
                       "poc")
    assert set(names()) == set(group_options("strategy")), "one conf/strategy/<name>.yaml per registered strategy"
    # Strategies with stages of their own are not offered as FedCorr's stage 3.
    staged = [name for name, entry in entries().items() if entry.round_method is None]
    assert staged == ["fedcorr", "feddiv", "fedes", "fednoro"]
    assert round_method("feddyn", "strategy.stage3").options.__name__ == "FedDynSettings"


def test_client_plugins_are_found_and_their_queries_registered_with_flower():
    assert list(client_methods()) == ["", "fedcorr", "feddiv", "feddyn", "fedes", "fednoro"]
    assert client_method("") is PLAIN
    assert set(client_app._registered_funcs) == {
        "query.info", "query.loss", "query.correct", "query.class_loss", "train.default", "evaluate.default"}
