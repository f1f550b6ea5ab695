"""CIFAR-10 and CIFAR-100 (its 100 classes or its 20 superclasses) from the python-version archives, in
torchvision's on-disk layout."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import ConfigError
from data.sources.arrays import SPLIT_ARRAYS, checked_labels, clean_dataset
from data.sources.base import Dataset
from data.sources.cache import download_root, load_cached
from data.sources.lookup import Lookup, as_path, download_hint

_ROW_LENGTH = 3 * 32 * 32


@dataclass(frozen=True)
class _Layout:
    """Where one CIFAR variant keeps its files and what its pickles call things."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    labels_key: bytes
    names_key: bytes
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    archive_url: str
    torchvision_class: str


CIFAR10 = _Layout(
    name="cifar10",
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_file="test_batch",
    meta_file="batches.meta",
    labels_key=b"labels",
    names_key=b"label_names",
    num_classes=10,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
    archive_url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    torchvision_class="CIFAR10",
)
CIFAR100 = _Layout(
    name="cifar100",
    folder="cifar-100-python",
    train_files=("train",),
    test_file="test",
    meta_file="meta",
    labels_key=b"fine_labels",
    names_key=b"fine_label_names",
    num_classes=100,
    mean=(0.5071, 0.4865, 0.4409),
    std=(0.2673, 0.2564, 0.2762),
    archive_url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    torchvision_class="CIFAR100",
)
# The same archive labelled by its 20 superclasses (CIFAR-100N's coarse human labels relabel these).
CIFAR100_COARSE = replace(CIFAR100, name="cifar100_coarse", labels_key=b"coarse_labels",
                          names_key=b"coarse_label_names", num_classes=20)


def load_cifar10(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """CIFAR-10 from ``root/cifar-10-batches-py``: uint8 images (3, 32, 32), 10 classes."""
    return _load(CIFAR10, root, download, cache_dir)


def load_cifar100(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """CIFAR-100 from ``root/cifar-100-python`` (fine labels): uint8 images (3, 32, 32)."""
    return _load(CIFAR100, root, download, cache_dir)


def load_cifar100_coarse(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """CIFAR-100 from ``root/cifar-100-python`` labelled by its 20 superclasses (coarse labels)."""
    return _load(CIFAR100_COARSE, root, download, cache_dir)


def _load(
    layout: _Layout,
    root: str | os.PathLike[str] | None,
    download: bool,
    cache_dir: str | os.PathLike[str] | None,
) -> Dataset:
    # Without a root, look where a download without a root would have gone.
    base = as_path(root) if root is not None else download_root(cache_dir)
    names = (*layout.train_files, layout.test_file, layout.meta_file)
    lookup = Lookup(layout.name)
    files = lookup.find_all([base / layout.folder], names)
    if files is None and download:
        files = _download(layout, base, lookup, names)
    if files is None:
        raise lookup.error(
            [
                f"download {layout.archive_url} and extract it into the dataset root"
                f" (giving <root>/{layout.folder}/)",
                download_hint(download),
            ]
        )
    *batches, meta = files
    classes = _class_names(layout, meta)
    arrays = load_cached(
        layout.name, batches, SPLIT_ARRAYS, lambda: _decode(layout, batches), cache_dir
    )
    return clean_dataset(layout.name, arrays, classes, layout.mean, layout.std)


def _download(
    layout: _Layout, base: Path, lookup: Lookup, names: tuple[str, ...]
) -> list[Path] | None:
    # Imported here: torchvision is slow to import and only this rare path needs it.
    import torchvision.datasets

    dataset_class = getattr(torchvision.datasets, layout.torchvision_class)
    try:
        dataset_class(str(base), train=True, download=True)
    except (OSError, RuntimeError) as err:
        lookup.miss(f"download into {base}", f"failed ({err})")
        return None
    return lookup.find_all([base / layout.folder], names)


def _class_names(layout: _Layout, meta: Path) -> tuple[str, ...]:
    names = _field(_unpickle(meta), layout.names_key, meta)
    if len(names) != layout.num_classes:
        raise ConfigError(f"{meta}: expected {layout.num_classes} class names, found {len(names)}")
    return tuple(name.decode() if isinstance(name, bytes) else str(name) for name in names)


def _decode(layout: _Layout, batches: list[Path]) -> dict[str, np.ndarray]:
    *train, test = (_read_batch(layout, path) for path in batches)
    return {
        "train_images": np.concatenate([images for images, _ in train]),
        "train_labels": np.concatenate([labels for _, labels in train]),
        "test_images": test[0],
        "test_labels": test[1],
    }


def _read_batch(layout: _Layout, path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _unpickle(path)
    data = np.asarray(_field(batch, b"data", path))
    labels = np.asarray(_field(batch, layout.labels_key, path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW_LENGTH:
        raise ConfigError(
            f"{path}: expected uint8 data of shape (n, {_ROW_LENGTH}),"
            f" got {data.dtype} {data.shape}"
        )
    labels = checked_labels(labels, len(data), layout.num_classes, path)
    return data.reshape(-1, 3, 32, 32), labels


def _field(batch: dict[bytes, Any], key: bytes, path: Path) -> Any:
    if not isinstance(batch, dict) or key not in batch:
        raise ConfigError(f"{path}: not a CIFAR python pickle (no {key.decode()!r} entry)")
    return batch[key]


# The only globals a CIFAR pickle (written by Python 2 or 3, any numpy) refers to. Anything else
# means the file is not CIFAR, and unpickling it could run arbitrary code.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path) -> Any:
    with path.open("rb") as f:
        try:
            # The archives were pickled by Python 2: their str keys and names load as bytes.
            return _CifarUnpickler(f, encoding="bytes").load()
        except Exception as err:  # a damaged pickle can fail in many ways; all mean the same here
            raise ConfigError(f"{path}: corrupt or not a CIFAR python pickle ({err!r})") from err
