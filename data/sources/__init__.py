"""Dataset sources by name: each loader finds, decodes (with a cache) and returns a Dataset."""

from __future__ import annotations

import os
from collections.abc import Callable

from common.errors import ConfigError
from data.sources.base import Dataset, ImageArray, Split
from data.sources.cifar import load_cifar10, load_cifar100
from data.sources.clothing1m import load_clothing1m
from data.sources.digits import load_digits
from data.sources.fashion_mnist import load_fashion_mnist

__all__ = ["DATASET_NAMES", "Dataset", "ImageArray", "Split", "check_dataset_name", "load_dataset"]

Loader = Callable[..., Dataset]

_LOADERS: dict[str, Loader] = {
    "fashion_mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "clothing1m": load_clothing1m,
    "digits": load_digits,
}
DATASET_NAMES: tuple[str, ...] = tuple(_LOADERS)


def check_dataset_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is one of DATASET_NAMES."""
    if not isinstance(name, str) or name not in _LOADERS:
        raise ConfigError(f"dataset={name!r} is unknown: allowed are {', '.join(DATASET_NAMES)}")


def load_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """The dataset ``name`` with its train and test splits.

    root: where to look first (the dataset's own layout under it); None uses the defaults.
    download: allow torchvision to download fashion_mnist / cifar10 / cifar100 when not found.
    cache_dir: where decoded arrays are cached; None uses ``$FEDCORR_CACHE_DIR`` or
        ``~/.cache/fedcorr-flower/datasets``.
    Raises ConfigError for an unknown name and DatasetNotFoundError when the data is missing.
    """
    check_dataset_name(name)
    return _LOADERS[name](root, download=download, cache_dir=cache_dir)
