"""Dataset sources by name: each loader finds, decodes (with a cache) and returns a Dataset."""

from __future__ import annotations

import os
from collections.abc import Callable

from common.errors import ConfigError, InvalidValue
from data.sources.base import Dataset, ImageArray, Split
from data.sources.cifar import load_cifar10, load_cifar100, load_cifar100_coarse
from data.sources.clothing1m import load_clothing1m
from data.sources.digits import load_digits
from data.sources.fashion_mnist import SYSTEM_DIR as FASHION_MNIST_SYSTEM_DIR
from data.sources.fashion_mnist import load_fashion_mnist
from data.sources.lookup import as_path, folder_problem

__all__ = [
    "DATASET_NAMES", "Dataset", "ImageArray", "Split", "check_dataset_name", "check_root", "load_dataset",
]

Loader = Callable[..., Dataset]

_LOADERS: dict[str, Loader] = {
    "fashion_mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "cifar100_coarse": load_cifar100_coarse,
    "clothing1m": load_clothing1m,
    "digits": load_digits,
}
DATASET_NAMES: tuple[str, ...] = tuple(_LOADERS)

# Where the sources torchvision downloads look without a root. With ``dataset.download=true`` their
# root may name a folder that does not exist yet: the download creates it.
_DOWNLOADS = "the download folder under the cache dir"
_WITHOUT_ROOT: dict[str, str] = {
    "fashion_mnist": f"the lookup order: {FASHION_MNIST_SYSTEM_DIR}, then {_DOWNLOADS}",
    "cifar10": _DOWNLOADS,
    "cifar100": _DOWNLOADS,
    "cifar100_coarse": _DOWNLOADS,
}
# The sources that are never downloaded.
_ROOT_ALLOWED: dict[str, str] = {
    "clothing1m": "allowed is the existing folder holding Clothing1M's list files and images "
                  "(it has no default place and cannot be downloaded)",
    "digits": "allowed is an existing folder or null (digits ships with scikit-learn and reads no root)",
}


def check_dataset_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is one of DATASET_NAMES."""
    if not isinstance(name, str) or name not in _LOADERS:
        raise ConfigError(f"dataset={name!r} is invalid: allowed are {', '.join(DATASET_NAMES)}")


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


def check_root(name: str, root: str | os.PathLike[str] | None, *, download: bool = False) -> None:
    """A root that is set must be a folder, so a mistyped one is never skipped for another place.

    Raises InvalidValue for ``dataset.root`` unless it is None, an existing folder, or (for a
    source torchvision downloads, with ``download``) a path the download will create.
    """
    if root is None:
        return
    problem = folder_problem(as_path(root))
    if problem is None or (problem == "does not exist" and download and name in _WITHOUT_ROOT):
        return
    if name not in _WITHOUT_ROOT:
        raise InvalidValue("dataset.root", str(root), _ROOT_ALLOWED[name])
    raise InvalidValue(
        "dataset.root", str(root),
        f"allowed is an existing folder, a new one with dataset.download=true, or null for {_WITHOUT_ROOT[name]}",
    )
