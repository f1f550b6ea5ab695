import pytest

from conf import compose_config, group_options
from data.errors import ConfigError
from data.scene import scene_spec


def test_defaults_are_the_fedcorr_fashion_mnist_scene():
    cfg = compose_config()
    assert (cfg.dataset.name, cfg.partition.name, cfg.noise.name, cfg.num_clients, cfg.seed) == (
        "fashion_mnist", "iid", "fedcorr", 100, 1)
    assert (cfg.noise.rho, cfg.noise.tau, cfg.noise.allow_true_label) == (0.6, 0.5, True)


@pytest.mark.parametrize("group", ["partition", "noise"])
def test_every_preset_of_a_group_is_valid(group):
    for option in group_options(group):
        dataset = "clothing1m" if option == "none" else "digits"
        spec = scene_spec(compose_config([f"{group}={option}", f"dataset={dataset}"]))
        assert spec[group]["name"] == option


def test_the_default_out_dir_changes_with_every_scene_setting():
    dirs = {compose_config(list(overrides)).out_dir for overrides in [
        (), ("noise.rho=0.8",), ("noise.tau=0.2",), ("partition=shards",), ("seed=2",), ("num_clients=50",),
        ("dataset=digits",), ("noise=symmetric",), ("noise=symmetric", "noise.eps=0.2"),
    ]}
    assert len(dirs) == 9


@pytest.mark.parametrize(
    "override,message",
    [
        ("dataset=mnist", r"dataset='mnist' is unknown: allowed are cifar10, cifar100, clothing1m, digits, fashion_mnist"),
        ("noise=label_swap", r"noise='label_swap' is unknown"),
        ("noise.bogus=1", r"Could not override 'noise.bogus'"),
        ("seed", r"bad override"),
    ],
)
def test_bad_overrides_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_config([override])
