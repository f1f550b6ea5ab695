"""Build what training and evaluation need from the run configuration: model, transforms, device."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from data.errors import ConfigError
from data.sources.base import Dataset
from data.transforms import BatchTransform, transform_from_config
from models import build_model


def configured_model(cfg: DictConfig, dataset: Dataset) -> torch.nn.Module:
    """The configured network, sized for the dataset's images and classes."""
    options = {key: value for key, value in OmegaConf.to_container(cfg.model).items() if key != "name"}
    channels, height, _ = dataset.image_shape
    crop = cfg.dataset.transforms.eval.get("crop")
    return build_model(cfg.model.name, num_classes=dataset.num_classes, in_channels=channels,
                       image_size=int(crop or height), **options)


def configured_transforms(cfg: DictConfig, dataset: Dataset) -> tuple[BatchTransform, BatchTransform]:
    """(train, eval) batch transforms for the dataset, from ``dataset.transforms`` in the config."""
    specs = OmegaConf.to_container(cfg.dataset.transforms)
    return (
        transform_from_config(specs["train"], dataset.mean, dataset.std, train=True),
        transform_from_config(specs["eval"], dataset.mean, dataset.std, train=False),
    )


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; an unavailable device is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"device={name!r} is invalid: allowed are auto, cpu, cuda, cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but CUDA is not available here; use device=auto or cpu")
    return device
