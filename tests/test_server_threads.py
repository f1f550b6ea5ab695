"""The torch threads of a run's central evaluation: the CPUs its own Ray is given
(``simulation.ray_init_args.num_cpus``), for the evaluation only; without that, torch's own count."""

from __future__ import annotations

import pytest
import torch
from defaults import composed

import server.evaluation
from common.errors import ConfigError
from settings.run import run_settings

RUN = "experiment=smoke strategy=fedavg strategy.num_rounds=2 strategy.train.epochs=1"


@pytest.fixture
def evaluated_on(monkeypatch) -> list[int]:
    """The torch thread count at each central evaluation of the runs of the test."""
    counts: list[int] = []
    evaluate = server.evaluation.evaluate_by_class

    def counting(*args, **kwargs):
        counts.append(torch.get_num_threads())
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(server.evaluation, "evaluate_by_class", counting)
    return counts


def test_the_server_evaluates_on_its_ray_cpus_and_puts_the_count_back(run_inprocess, evaluated_on):
    assert torch.get_num_threads() == 1  # the test process's own (conftest)
    payload, _ = run_inprocess(f"{RUN} ++simulation.ray_init_args.num_cpus=2")
    assert payload["complete"] and evaluated_on == [2, 2]
    assert torch.get_num_threads() == 1


def test_without_ray_cpus_the_evaluation_keeps_torchs_count(run_inprocess, evaluated_on):
    run_inprocess(RUN)
    assert evaluated_on == [1, 1]


@pytest.mark.parametrize(("num_cpus", "threads"), [(None, None), (1, 1), (3, 3)])
def test_the_setting_follows_the_ray_cpus(num_cpus, threads):
    overrides = [] if num_cpus is None else [f"++simulation.ray_init_args.num_cpus={num_cpus}"]
    assert run_settings(composed(*overrides)).server.num_threads == threads


def test_it_is_not_a_key_of_its_own():
    with pytest.raises(ConfigError, match=r"^server config has unknown keys \['num_threads'\]"):
        run_settings(composed("+server.num_threads=2"))
