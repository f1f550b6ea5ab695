"""Compose the Hydra configuration in this folder from command-line style overrides."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent


def _tag(node: DictConfig) -> str:
    """``${tag:${noise}}`` -> ``fedcorr_allow_true_label=True_rho=0.6_tau=0.5``: a group's name and
    parameters as a path-safe string, so default output folders differ whenever the settings do."""
    params = [f"{key}={node[key]}" for key in sorted(node) if key != "name"]
    return "_".join([str(node["name"]), *params]).replace("/", "-")


if not OmegaConf.has_resolver("tag"):
    OmegaConf.register_new_resolver("tag", _tag)


def group_options(group: str) -> list[str]:
    """The names a config group accepts (its YAML files), e.g. ``group_options("noise")``."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config for ``overrides`` such as ``["noise=symmetric", "seed=2"]``.

    Hydra's own errors (an unknown group option, a key that does not exist) become one ConfigError
    that names the bad override and, for a group, the options it has.
    """
    for override in overrides:
        group, sep, value = override.partition("=")
        if sep and (CONF_DIR / group).is_dir() and value not in group_options(group):
            raise ConfigError(
                f"{group}={value!r} is unknown: allowed are {', '.join(group_options(group))}"
            )
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"bad override in {' '.join(overrides)!r}: {err}") from err
    return cfg
