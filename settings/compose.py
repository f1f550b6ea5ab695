"""Compose the Hydra configuration in ``conf/`` from command-line style overrides.

``conf/`` holds only YAML: every default lives there. This module registers the resolvers its
``out_dir`` default uses and composes it, in-process or inside ``sim.py``'s ``@hydra.main``.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def _tag(node: DictConfig) -> str:
    """``${tag:${noise}}`` -> ``fedcorr_allow_true_label=True_rho=0.6_tau=0.5``: a group's name and
    parameters as a path-safe string, so default output folders differ whenever the settings do. A
    parameter at null (an option left off) is not written, so adding one keeps the existing folders."""
    params = [f"{key}={node[key]}" for key in sorted(node) if key != "name" and node[key] is not None]
    return "_".join([str(node["name"]), *params]).replace("/", "-")


def _strategy_dir(node: DictConfig) -> str:
    """``${strategy_dir:${strategy}}`` -> ``fedcorr``, or ``fedcorr+feddyn`` when FedCorr's stage 3 is
    not FedAvg, so runs that differ only in their stage-3 strategy write to different folders."""
    stage3 = node.get("stage3", "fedavg")
    return str(node["name"]) + ("" if stage3 == "fedavg" else f"+{stage3}")


if not OmegaConf.has_resolver("tag"):
    OmegaConf.register_new_resolver("tag", _tag)
if not OmegaConf.has_resolver("strategy_dir"):
    OmegaConf.register_new_resolver("strategy_dir", _strategy_dir)


def group_options(group: str) -> list[str]:
    """The names a config group accepts (its YAML files), e.g. ``group_options("noise")``."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config for ``overrides`` such as ``["noise=symmetric", "seed=2"]``.

    Hydra's own errors (an unknown group option, a key that does not exist) become one ConfigError
    that names the bad override and, for a group, the options it has. The result is the caller's own
    copy: compositions are cached per process (one takes about 0.3 s), and a plain ``out_dir=<path>``
    is set on a cached composition of the other overrides, since no key of ``conf/`` refers to it.
    """
    for override in overrides:
        key, sep, value = override.partition("=")
        # A group chosen at a package (``strategy/local@strategy.train=fnbench``) has its options in the group's folder.
        group = key.partition("@")[0]
        if sep and (CONF_DIR / group).is_dir() and value not in group_options(group):
            raise ConfigError(
                f"{key}={value!r} is invalid: allowed are {', '.join(group_options(group))}"
            )
    paths = [override for override in overrides if _PLAIN_OUT_DIR.fullmatch(override)]
    others = tuple(override for override in overrides if override not in paths)
    try:
        cfg = copy.deepcopy(_composed(others, GlobalHydra.instance().is_initialized()))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"bad override in {' '.join(overrides)!r}: {err}") from err
    for override in paths:  # the last one wins, as in Hydra
        cfg.out_dir = override.partition("=")[2]
    return cfg


# ``out_dir=`` a path Hydra reads as the same plain string: a slash, and no quote, interpolation or list.
_PLAIN_OUT_DIR = re.compile(r"out_dir=[\w.+-]*/[\w./+-]*")


@functools.lru_cache(maxsize=64)
def _composed(overrides: tuple[str, ...], in_hydra_main: bool) -> DictConfig:
    if in_hydra_main:
        # Inside sim.py's @hydra.main, whose search path is this same folder.
        cfg = compose("config", overrides=list(overrides))
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
    OmegaConf.resolve(cfg)
    return cfg


RUN_CONFIG_KEY = "overrides"
WORKDIR_KEY = "workdir"
"""Run config key (simulation only): the folder a relative ``out_dir`` is relative to. A client on
another node of a Ray cluster starts in that node's own folder."""
COMMAND_KEY = "command"
"""The run config key under which ``sim.py`` passes its command line, for the run's provenance."""


def compose_from_run_config(run_config: Mapping[str, Any]) -> DictConfig:
    """The config for a Flower run: Hydra overrides travel as one string under the run config key
    ``overrides`` (``flwr run . --run-config 'overrides="experiment=smoke seed=2"'``). Composed once
    per process, as ``compose_config`` caches its compositions."""
    return compose_config(shlex.split(str(run_config.get(RUN_CONFIG_KEY, ""))))
