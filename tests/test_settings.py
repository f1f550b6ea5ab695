"""The typed settings of a run: built once from the composed config, every bad value named by its key."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
from server.config import load_run
from settings import compose as composition
from settings.compose import CONF_DIR, _hydra_composed, compose_config, thawed
from settings.run import RunSettings, SimulationSettings, run_settings


def settings(*overrides: str) -> RunSettings:
    return run_settings(compose_config(list(overrides)))


def test_the_default_run_is_typed_and_frozen():
    s = settings()
    assert (s.seed, s.num_clients, s.ground_truth, s.comm_budget) == (1, 100, False, None)
    assert (s.scene.dataset.name, s.scene.partition.name, s.scene.noise.name) == ("fashion_mnist", "iid", "fedcorr")
    assert s.scene.noise.params == {"rho": 0.6, "tau": 0.5, "allow_true_label": True, "label_pool": None}
    assert (s.model.name, s.transforms.train.crop, s.transforms.train.pad, s.transforms.eval.crop) == \
        ("lenet5", 28, 2, None)
    assert (s.server.on_client_error, s.client.num_threads, s.simulation.num_cpus_per_client) == ("fail", 1, 1.0)
    assert s.resolved["strategy"]["name"] == "fedcorr"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 2  # type: ignore[misc]


@pytest.mark.parametrize(("override", "message"), [
    ("server.eval_every=0", r"^server.eval_every=0 is invalid: allowed is an integer >= 1$"),
    ("server.on_client_error=retry", r"^server.on_client_error='retry' is invalid: allowed are fail, skip$"),
    ("server.round_timeout=-1", r"^server.round_timeout=-1 is invalid: allowed is a number > 0.0$"),
    ("+server.retries=3", r"server config has unknown keys \['retries'\]"),
    ("simulation.num_cpus_per_client=0", r"^simulation.num_cpus_per_client=0 is invalid"),
    ("simulation.verbose=maybe", r"^simulation.verbose='maybe' is invalid: allowed is true or false$"),
    ("ground_truth=maybe", r"^ground_truth='maybe' is invalid: allowed is true or false$"),
    ("comm_budget=0", r"^comm_budget=0 is invalid: allowed is an integer >= 1$"),
    ("seed=-1", r"^seed=-1 is invalid: allowed is an integer >= 0 and <= 4294967295 \(the seed feeds scikit-learn"),
    ("dataset.transforms.train.crop=0", r"^dataset.transforms.train.crop=0 is invalid: allowed is an integer >= 1$"),
    ("dataset.download=maybe", r"^dataset.download='maybe' is invalid"),
    ("model=resnet50", None),
    ("+model.depth=3", r"model 'lenet5' does not take option\(s\) depth"),
    ("noise.rho=1.5", r"^noise.rho=1.5 is invalid: allowed is a number >= 0.0 and <= 1.0$"),
])
def test_every_bad_value_is_named_by_its_config_key(override, message):
    if message is None:
        assert settings(override).model.options == {"weights_path": None, "pretrained": None}
        return
    with pytest.raises(ConfigError, match=message):
        settings(override)


@pytest.mark.parametrize(("values", "message"), [
    ({"num_cpus_per_client": 0.0}, r"num_cpus_per_client=0.0 is invalid"),
    ({"num_cpus_per_client": 3.0, "ray_init_args": {"num_cpus": 2}}, r"num_cpus_per_client=3.0 is invalid"),
    ({"num_gpus_per_client": -1.0}, r"num_gpus_per_client=-1.0 is invalid"),
    ({"num_gpus_per_client": 1.0, "ray_init_args": {"num_gpus": 0}}, r"num_gpus_per_client=1.0 is invalid"),
])
def test_ray_resources_that_cannot_fit_are_refused_before_ray_could_start(values, message):
    with pytest.raises(ConfigError, match=message):
        SimulationSettings(**{"num_cpus_per_client": 1.0, "num_gpus_per_client": 0.0, "ray_init_args": {},
                              "verbose": False, "ray_address": None, **values})


def test_a_cluster_may_hold_more_cpus_than_this_machine():
    # Its nodes, not this machine, hold the resources: a client may ask for more cores than are here.
    many = SimulationSettings(num_cpus_per_client=4096.0, num_gpus_per_client=0.0, ray_init_args={}, verbose=False,
                              ray_address="10.0.0.1:6379")
    assert many.num_cpus_per_client == 4096.0
    with pytest.raises(ConfigError, match=r"num_cpus_per_client=4096.0 is invalid"):
        SimulationSettings(num_cpus_per_client=4096.0, num_gpus_per_client=0.0, ray_init_args={}, verbose=False,
                           ray_address=None)


def test_the_strategy_block_is_checked_by_the_server_side_only():
    """The ClientApp builds only the run settings; a strategy typo is the ServerApp's (and sim.py's) error."""
    bad = compose_config(["strategy.t1=0"])
    assert run_settings(bad).num_clients == 100
    with pytest.raises(ConfigError, match=r"^strategy.t1=0 is invalid: allowed is an integer >= 1$"):
        load_run(bad)


def test_a_client_threads_follow_its_ray_cpus():
    assert settings("simulation.num_cpus_per_client=2").client.num_threads == 2
    assert settings("simulation.num_cpus_per_client=0.5").client.num_threads == 1


@pytest.mark.parametrize("overrides", [
    ("experiment=smoke", "out_dir=/tmp/runs/a+b/run-1.x"),
    ("strategy=fednoro", "noise=pairflip", "seed=3", "out_dir=outputs/x", "out_dir=rel/path"),
])
def test_a_path_out_dir_set_on_a_cached_composition_equals_hydras_own(overrides):
    hydras = thawed(_hydra_composed(tuple(overrides), False))  # Hydra composes every override itself
    OmegaConf.resolve(hydras)
    assert OmegaConf.to_container(compose_config(list(overrides))) == OmegaConf.to_container(hydras)
    assert compose_config(list(overrides)).out_dir == overrides[-1].partition("=")[2]


def uncached(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """An empty cache of the test's own in place of each named one of the process, which stays as it
    was: clearing it would make every later test of this worker compose again what it had composed."""
    for name in names:
        cached = getattr(composition, name)
        monkeypatch.setattr(composition, name, functools.lru_cache(maxsize=cached.cache_info().maxsize)(
            cached.__wrapped__))


@pytest.mark.parametrize("overrides", [
    ("experiment=smoke", "strategy=fedprox", "strategy.mu=0.5", "seed=3"),
    ("strategy.mu=0.5", "strategy=fedprox"),  # a setting before the group it lies in
    ("strategy.t1=3", "noise=symmetric", "noise.eps=0.2", "seed=2"),
    ("experiment=smoke", "strategy.train.lr=0.01", "strategy.train.lr=0.02"),
    ("experiment=smoke", "strategy.train.lr=${strategy.train.momentum}"),
    ("experiment=smoke", "strategy.train={lr:0.5,momentum:0.1}"),
    ("experiment=smoke", "strategy.train=fnbench"),
    ("strategy=fednoro", "strategy/local@strategy.train=fnbench", "strategy.train.epochs=2"),
    ("experiment=smoke", "++simulation.ray_init_args.num_cpus=1", "seed=4"),
    ("experiment=smoke", "~strategy.train.lr", "seed=5"),
    ("experiment=smoke", "+strategy.extra=1", "seed=6"),
    ("strategy=fednoro", "noise=pairflip", "partition=dirichlet", "partition.alpha=0.3", "model=cnn9"),
    ("experiment=smoke", "noise.rhoo=1"),
    ("experiment=smoke", "strategy.zz=1", "seed=7"),
    ("experiment=smoke", "seed=[1"),
    ("experiment=smoke", "seed=1,2"),
    ("experiment=smoke", "hydra.job.chdir=true", "seed=8"),
    ("experiment=smoke", "dataset.transforms.train.crop=-3"),
])
def test_plain_settings_on_a_cached_composition_equal_hydras_own(overrides, monkeypatch):
    def composed() -> object:  # the resolved config, or the error line
        try:
            return OmegaConf.to_container(compose_config(list(overrides)))
        except ConfigError as err:
            return str(err)

    ours = composed()
    uncached(monkeypatch, "_composed")
    monkeypatch.setattr(composition, "_with_settings", lambda *args: None)  # Hydra composes every override
    assert composed() == ours


def test_runs_that_differ_only_in_plain_settings_share_one_composition_by_hydra(monkeypatch):
    uncached(monkeypatch, "_composed", "_hydra_composed")
    for seed in range(1, 4):
        cfg = compose_config(["experiment=smoke", "strategy=fedavg", f"seed={seed}", "strategy.train.lr=0.1"])
        assert (cfg.seed, cfg.strategy.train.lr) == (seed, 0.1)
    compose_config(["strategy.train.lr=0.2", "experiment=smoke", "strategy=fedavg"])
    assert composition._hydra_composed.cache_info().misses == 1
    compose_config(["experiment=smoke", "strategy=fedprox", "seed=2"])
    assert composition._hydra_composed.cache_info().misses == 2


def test_out_dir_is_not_read_by_any_other_key_of_conf():
    """What lets a cached composition take its out_dir afterwards."""
    readers = [path for path in CONF_DIR.rglob("*.yaml") if "out_dir}" in path.read_text()]
    assert readers == []


def test_each_composition_is_the_callers_own_copy():
    fresh = OmegaConf.to_container(compose_config(["experiment=smoke", "out_dir=/tmp/two/run"]))
    first = compose_config(["experiment=smoke", "out_dir=/tmp/one/run"])
    first.seed, first.strategy.name = 99, "changed"
    assert OmegaConf.to_container(compose_config(["experiment=smoke", "out_dir=/tmp/two/run"])) == fresh
