"""Clothing1M from its own list files; images decode lazily, as a million never fit in memory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from common.errors import ConfigError, DatasetNotFoundError
from data.sources.base import Dataset, Split
from data.sources.cache import load_cached
from data.sources.lookup import Lookup, as_path

CATEGORIES = "category_names_eng.txt"
NOISY_LABELS = "noisy_label_kv.txt"
CLEAN_LABELS = "clean_label_kv.txt"
NOISY_TRAIN = "noisy_train_key_list.txt"
CLEAN_TEST = "clean_test_key_list.txt"
FILES = (CATEGORIES, NOISY_LABELS, CLEAN_LABELS, NOISY_TRAIN, CLEAN_TEST)
IMAGE_SIZE = 256
# ImageNet statistics, as used by the ImageNet-pretrained ResNet-50 trained on Clothing1M.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_ARRAYS = ("train_paths", "train_labels", "train_true", "test_paths", "test_labels")


class Clothing1MImages:
    """uint8 images (n, 3, S, S); indexing decodes and resizes only the images asked for."""

    def __init__(self, root: Path, paths: np.ndarray, size: int = IMAGE_SIZE) -> None:
        self.root = root
        self.paths = paths
        self.size = size
        self.shape: tuple[int, ...] = (len(paths), 3, size, size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int | slice | np.ndarray) -> np.ndarray:
        """One image (3, S, S) for an int; a batch (b, 3, S, S) for a slice or a 1-D int array."""
        if isinstance(index, slice):
            positions = np.arange(*index.indices(len(self)))
        else:
            positions = np.asarray(index)
            if not np.issubdtype(positions.dtype, np.integer) or positions.ndim > 1:
                raise IndexError(
                    f"index must be an int, a slice or a 1-D int array, got {positions.dtype}"
                    f" of shape {positions.shape}"
                )
            if positions.size and (positions.min() < -len(self) or positions.max() >= len(self)):
                raise IndexError(f"index out of range for {len(self)} images")
        if positions.ndim == 0:
            return self._decode(int(positions))
        batch = np.empty((len(positions), *self.shape[1:]), dtype=np.uint8)
        for row, position in enumerate(positions):
            batch[row] = self._decode(int(position))
        return batch

    def path(self, position: int) -> Path:
        """The file of image ``position``."""
        return self.root / self.paths[position].decode()

    def _decode(self, position: int) -> np.ndarray:
        path = self.path(position)
        try:
            with Image.open(path) as image:
                # PIL's bilinear resize widens its filter when shrinking, i.e. it is antialiased.
                rgb = image.convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
        except FileNotFoundError as err:
            raise DatasetNotFoundError(f"Clothing1M image {path} not found") from err
        except OSError as err:  # PIL reports unreadable and truncated images as OSError
            raise ConfigError(f"{path}: not a decodable image ({err})") from err
        return np.ascontiguousarray(np.asarray(rgb).transpose(2, 0, 1))


def load_clothing1m(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Clothing1M from ``root``: its list files plus the images at the paths they name.

    Train split: ``noisy_train_key_list.txt`` with the noisy labels; ``true_labels`` is the clean
    label where ``clean_label_kv.txt`` has one, else -1. Test split: ``clean_test_key_list.txt``
    with clean labels. Clothing1M cannot be downloaded automatically: ``download`` changes nothing.
    """
    lookup = Lookup("clothing1m")
    files = None
    if root is None:
        lookup.miss("dataset root", "none given (Clothing1M has no default location)")
    else:
        files = lookup.find_all([as_path(root)], FILES)
    if files is None:
        raise lookup.error(
            [
                "request Clothing1M from its authors (https://github.com/Cysu/noisy_label), extract"
                f" the list files ({', '.join(FILES)}) and the images/ folder into one directory,"
                " and pass it as the dataset root (config: dataset.root=...)",
                "it cannot be downloaded automatically (download=True does not help)",
            ]
        )
    assert root is not None  # without a root, files is None and the lookup error was raised
    base = as_path(root)
    arrays = load_cached("clothing1m", files, _ARRAYS, lambda: _decode(base), cache_dir)
    train_images = Clothing1MImages(base, arrays["train_paths"])
    train = Split(
        train_images,
        np.asarray(arrays["train_labels"]),
        np.asarray(arrays["train_true"]),
    )
    test_labels = np.asarray(arrays["test_labels"])
    test_images = Clothing1MImages(base, arrays["test_paths"])
    test = Split(test_images, test_labels, test_labels)
    for images in (train_images, test_images):
        _check_first_image(images)
    return Dataset(
        name="clothing1m",
        train=train,
        test=test,
        classes=_read_lines(base / CATEGORIES),
        mean=MEAN,
        std=STD,
    )


def _decode(root: Path) -> dict[str, np.ndarray]:
    num_classes = len(_read_lines(root / CATEGORIES))
    noisy = _read_labels(root / NOISY_LABELS, num_classes)
    clean = _read_labels(root / CLEAN_LABELS, num_classes)
    train_keys = _read_lines(root / NOISY_TRAIN)
    test_keys = _read_lines(root / CLEAN_TEST)
    return {
        "train_paths": _encoded(train_keys),
        "train_labels": _labels_of(train_keys, noisy, NOISY_TRAIN, NOISY_LABELS),
        "train_true": np.array([clean.get(key, -1) for key in train_keys], dtype=np.int64),
        "test_paths": _encoded(test_keys),
        "test_labels": _labels_of(test_keys, clean, CLEAN_TEST, CLEAN_LABELS),
    }


def _encoded(keys: tuple[str, ...]) -> np.ndarray:
    # Fixed-width bytes, not Python strings, so the cache can memory-map a million paths.
    return np.array([key.encode() for key in keys], dtype=bytes)


def _read_lines(path: Path) -> tuple[str, ...]:
    with path.open(encoding="utf-8") as f:
        return tuple(line.strip() for line in f if line.strip())


def _read_labels(path: Path, num_classes: int) -> dict[str, int]:
    labels = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) >= num_classes:
                raise ConfigError(
                    f"{path}:{number}: expected '<image path> <label in 0..{num_classes - 1}>',"
                    f" got {line.strip()!r}"
                )
            labels[fields[0]] = int(fields[1])
    return labels


def _labels_of(
    keys: tuple[str, ...], labels: dict[str, int], key_file: str, label_file: str
) -> np.ndarray:
    missing = [key for key in keys if key not in labels]
    if missing:
        raise ConfigError(
            f"Clothing1M: {len(missing)} images in {key_file} have no label in {label_file},"
            f" e.g. {missing[0]!r}"
        )
    return np.array([labels[key] for key in keys], dtype=np.int64)


def _check_first_image(images: Clothing1MImages) -> None:
    # A wrong root or a missing images/ folder should fail at load time, not mid-training.
    if len(images) and not images.path(0).is_file():
        raise DatasetNotFoundError(
            f"Clothing1M image {images.path(0)} not found: extract the images/ folder into"
            f" {images.root}"
        )
