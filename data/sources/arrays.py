"""Checks and packaging shared by the sources that decode whole datasets into arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.errors import ConfigError
from data.sources.base import Dataset, Split

# The arrays such a source decodes and caches.
SPLIT_ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")


def checked_labels(labels: np.ndarray, count: int, num_classes: int, path: Path) -> np.ndarray:
    """``labels`` as int64 after checking there is one integer per image, each a valid class."""
    if labels.shape != (count,) or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"{path}: expected {count} integer labels (one per image),"
            f" got {labels.dtype} {labels.shape}"
        )
    if count and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError(
            f"{path}: labels must lie in [0, {num_classes}), got {labels.min()}..{labels.max()}"
        )
    return labels.astype(np.int64)


def clean_dataset(
    name: str,
    arrays: dict[str, np.ndarray],
    classes: tuple[str, ...],
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> Dataset:
    """A Dataset from the SPLIT_ARRAYS of a source whose labels are all correct."""

    def split(part: str) -> Split:
        # A plain (read-only) view, not a memmap subclass; the labels are the true labels too.
        labels = np.asarray(arrays[f"{part}_labels"])
        return Split(images=arrays[f"{part}_images"], labels=labels, true_labels=labels)

    return Dataset(
        name=name, train=split("train"), test=split("test"), classes=classes, mean=mean, std=std
    )
