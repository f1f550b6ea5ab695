"""Compose the Hydra configuration in ``conf/`` from command-line style overrides.

``conf/`` holds only YAML: every default lives there. This module registers the resolvers its
``out_dir`` default uses and composes it, in-process or inside ``sim.py``'s ``@hydra.main``.
"""

from __future__ import annotations

import functools
import pickle
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.errors import ConfigError
from settings.identity import digest

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


FOLDER_NAMES = {"noise": {"fedcorr": "perclient"}}
"""Folder words for group options whose name would mislead in a path: FedCorr's noise model (each client
noisy with probability rho, at a level from U(tau, 1)) is used by every method, so a FedNoRo run's noise
folder does not read "fedcorr"."""


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value).replace("=", "-")


def _tag(node: DictConfig, group: str) -> str:
    """``${tag:${noise},noise}`` -> ``perclient_allow_true_label-on_rho-0.6_tau-0.5``: a group's option
    and parameters as a path-safe string (no ``=``; booleans as on/off), so default output folders differ
    whenever the settings do. A parameter at null (an option left off) is not written, so adding one
    keeps the existing folders."""
    name = str(node["name"])
    params = [f"{key}-{_value(node[key])}" for key in sorted(node) if key != "name" and node[key] is not None]
    return "_".join([FOLDER_NAMES.get(group, {}).get(name, name), *params]).replace("/", "-")


def _strategy_dir(node: DictConfig) -> str:
    """``${strategy_dir:${strategy}}`` -> ``fedcorr``, or ``fedcorr+feddyn`` when FedCorr's stage 3 is
    not FedAvg."""
    stage3 = node.get("stage3", "fedavg")
    return str(node["name"]) + ("" if stage3 == "fedavg" else f"+{stage3}")


def _run_digest(*, _root_: DictConfig) -> str:
    """``${run_digest:}`` -> eight hex digits of every setting outside the scene and the execution keys
    (``settings.identity.digest``), so runs of one scene that compute different things write to
    different folders. Reads every key but ``out_dir`` (which no other key reads)."""
    values = {str(key): OmegaConf.to_container(_root_[key], resolve=True) if OmegaConf.is_config(_root_[key])
              else _root_[key] for key in _root_ if key != "out_dir"}
    return digest(values)


if not OmegaConf.has_resolver("tag"):
    OmegaConf.register_new_resolver("tag", _tag)
if not OmegaConf.has_resolver("strategy_dir"):
    OmegaConf.register_new_resolver("strategy_dir", _strategy_dir)
if not OmegaConf.has_resolver("run_digest"):
    OmegaConf.register_new_resolver("run_digest", _run_digest)


def group_options(group: str) -> list[str]:
    """The names a config group accepts (its YAML files), e.g. ``group_options("noise")``."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config for ``overrides`` such as ``["noise=symmetric", "seed=2"]``.

    Hydra's own errors (an unknown group option, a key that does not exist) become one ConfigError
    that names the bad override and, for a group, the options it has. The result is the caller's own
    copy. Compositions are cached per process: Hydra composes each distinct set of group choices once
    (about 0.2 s), and the settings (``key=value``, ``+key=value``, ``~key`` on keys that are no group)
    are applied to a copy of it (``_with_settings``, some 20 ms). A plain ``out_dir=<path>`` is set on
    a cached composition of the other overrides, since no key of ``conf/`` refers to it.
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
        cfg = thawed(_composed(others, GlobalHydra.instance().is_initialized()))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"bad override in {' '.join(overrides)!r}: {err}") from err
    for override in paths:  # the last one wins, as in Hydra
        cfg.out_dir = override.partition("=")[2]
    return cfg


# ``out_dir=`` a path Hydra reads as the same plain string: a slash, and no quote, interpolation or list.
_PLAIN_OUT_DIR = re.compile(r"out_dir=[\w.+-]*/[\w./+-]*")

COMPOSITIONS_KEPT = 512
"""How many compositions each cache keeps (about 12 kB each, pickled). A run composes a handful; a
process that composes many (the test suite: some 230 distinct sets of group choices) recomposes none
that it has made, where 64 made it redo a fifth of them."""


def thawed(frozen: bytes) -> DictConfig:
    """A config of the caller's own from a cached composition. The caches keep them pickled: a copy
    unpickled takes about 1 ms, where ``copy.deepcopy`` of the config takes 5-10 ms."""
    cfg = pickle.loads(frozen)  # bytes this module pickled itself, in this process
    assert isinstance(cfg, DictConfig)
    return cfg


@functools.lru_cache(maxsize=COMPOSITIONS_KEPT)
def _composed(overrides: tuple[str, ...], in_hydra_main: bool) -> bytes:
    """The resolved config for ``overrides``, pickled."""
    cfg = _with_settings(overrides, in_hydra_main)
    if cfg is None:
        cfg = thawed(_hydra_composed(overrides, in_hydra_main))
    OmegaConf.resolve(cfg)
    return pickle.dumps(cfg)


def _with_settings(overrides: tuple[str, ...], in_hydra_main: bool) -> DictConfig | None:
    """The config for ``overrides`` from a cached composition of the others than its settings.

    Hydra composes the config groups' choices (the costly part, cached per distinct set), then applies
    each override of a key that is no group (a setting, its addition or deletion) to the composed
    config, last. That same step of Hydra's applies them here to a copy of the cached composition. None
    where Hydra is to compose the whole command line itself: there is no setting, or something fails,
    so that the error is Hydra's own."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None
    setting = [_is_setting(override) for override in parsed]
    if not any(setting):
        return None
    groups = tuple(word for word, is_setting in zip(overrides, setting) if not is_setting)
    try:
        cfg = thawed(_hydra_composed(groups, in_hydra_main))
        # Hydra's own step (a private one: hydra-core is pinned below 1.4), so the semantics are Hydra's.
        ConfigLoaderImpl._apply_overrides_to_config([o for o, is_setting in zip(parsed, setting) if is_setting], cfg)
    except (HydraException, OmegaConfBaseException):
        return None
    return cfg


@functools.lru_cache(maxsize=COMPOSITIONS_KEPT)
def _hydra_composed(overrides: tuple[str, ...], in_hydra_main: bool) -> bytes:
    """Hydra's own composition of ``overrides``, unresolved, pickled."""
    if in_hydra_main:
        # Inside sim.py's @hydra.main, whose search path is this same folder.
        return pickle.dumps(compose("config", overrides=list(overrides)))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return pickle.dumps(compose("config", overrides=list(overrides)))


def _is_setting(override: Override) -> bool:
    """An override Hydra applies to the composed config, last: one whose key is no config group (its
    addition, change or deletion)."""
    return not (CONF_DIR / override.key_or_group).is_dir()


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
