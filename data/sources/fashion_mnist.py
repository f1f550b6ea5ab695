"""Fashion-MNIST from IDX files: a given root, Debian's ``dataset-fashion-mnist`` or a download."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from common.errors import ConfigError
from data.sources.arrays import SPLIT_ARRAYS, checked_labels, clean_dataset
from data.sources.base import Dataset
from data.sources.cache import download_root, load_cached
from data.sources.idx import read_idx
from data.sources.lookup import Lookup, as_path, download_hint

SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
MEAN = (0.2860,)
STD = (0.3530,)


def load_fashion_mnist(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Fashion-MNIST: 60000 train / 10000 test uint8 images of shape (1, 28, 28), 10 classes.

    Looks in ``root`` and ``root/FashionMNIST/raw`` (torchvision's layout) if ``root`` is given,
    then in ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``), and without
    a root in the download folder under the cache dir. Each IDX file may be gzip-compressed or not.
    Only with ``download=True`` is torchvision asked to download into ``root`` (or the download
    folder) when all of these miss.
    """
    if root is not None:
        base = as_path(root)
        candidates = [base, base / "FashionMNIST" / "raw", SYSTEM_DIR]
    else:
        # Without a root, a download without a root went to the download folder.
        base = download_root(cache_dir)
        candidates = [SYSTEM_DIR, base / "FashionMNIST" / "raw"]
    lookup = Lookup("fashion_mnist")
    files = lookup.find_all(candidates, FILES, suffixes=(".gz", ""))
    if files is None and download:
        files = _download(base, lookup)
    if files is None:
        raise lookup.error(
            [
                f"apt-get install -y dataset-fashion-mnist (installs {SYSTEM_DIR})",
                f"or put the four IDX files ({', '.join(FILES)}, .gz or not) in the dataset root",
                download_hint(download),
            ]
        )
    arrays = load_cached("fashion_mnist", files, SPLIT_ARRAYS, lambda: _decode(files), cache_dir)
    return clean_dataset("fashion_mnist", arrays, CLASSES, MEAN, STD)


def _download(base: Path, lookup: Lookup) -> list[Path] | None:
    # Imported here: torchvision is slow to import and only this rare path needs it.
    from torchvision.datasets import FashionMNIST

    try:
        FashionMNIST(str(base), train=True, download=True)
    except (OSError, RuntimeError) as err:
        lookup.miss(f"download into {base}", f"failed ({err})")
        return None
    return lookup.find_all([base / "FashionMNIST" / "raw"], FILES, suffixes=(".gz", ""))


def _decode(files: list[Path]) -> dict[str, np.ndarray]:
    train_images, train_labels, test_images, test_labels = (read_idx(path) for path in files)
    classes = len(CLASSES)
    return {
        "train_images": _images(train_images, files[0]),
        "train_labels": checked_labels(train_labels, len(train_images), classes, files[1]),
        "test_images": _images(test_images, files[2]),
        "test_labels": checked_labels(test_labels, len(test_images), classes, files[3]),
    }


def _images(images: np.ndarray, path: Path) -> np.ndarray:
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ConfigError(
            f"{path}: expected uint8 images of shape (n, 28, 28), got {images.dtype} {images.shape}"
        )
    return images[:, None, :, :]
