"""The scene part of the configuration: which data, how it is split and made noisy, and where it lives.

Torch-free, so the scene and export command lines start fast; ``settings.run`` builds on it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from common.errors import InvalidValue
from common.validation import from_mapping
from data.scene import DatasetSource, SceneSpec


def resolved(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """The configuration as plain, resolved containers."""
    if isinstance(cfg, DictConfig):
        container = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(container, dict)
        return {str(key): value for key, value in container.items()}
    return cfg


def scene_spec(cfg: DictConfig | dict[str, Any]) -> SceneSpec:
    """The checked ``SceneSpec`` of a configuration (``dataset``, ``num_clients``, ``seed``, ``partition``,
    ``noise``)."""
    values = resolved(cfg)
    dataset = {key: value for key, value in values["dataset"].items() if key != "transforms"}
    source = from_mapping(DatasetSource, dataset, "dataset")
    return SceneSpec.build(source, values["num_clients"], values["seed"], values["partition"], values["noise"])


def out_dir(cfg: DictConfig | dict[str, Any]) -> str:
    """The run's output folder, as configured (a non-empty path)."""
    value = resolved(cfg).get("out_dir")
    if not isinstance(value, str) or not value:
        raise InvalidValue("out_dir", value, "allowed is a folder path")
    return value
