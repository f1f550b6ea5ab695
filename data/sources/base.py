"""The shape every dataset source returns: uint8 images, int64 labels, class names, normalisation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ImageArray(Protocol):
    """uint8 images of shape (n, C, H, W), indexable by an integer index array.

    In-memory datasets use a plain (possibly memory-mapped) ``np.ndarray``; datasets too large for
    memory (Clothing1M) provide an object that decodes only the requested images.
    """

    shape: tuple[int, ...]

    def __len__(self) -> int: ...

    def __getitem__(self, index: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Split:
    """One split (train or test) of a dataset.

    images: uint8 array of shape (n, C, H, W).
    labels: int64 array of shape (n,), the labels as the dataset ships them.
    true_labels: int64 array of shape (n,) with the known correct label, -1 where unknown. For
        datasets with clean labels this is ``labels`` itself; Clothing1M ships noisy labels and
        knows the clean one only for a subset.
    """

    images: ImageArray
    labels: np.ndarray
    true_labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class Dataset:
    """A dataset with train and test splits and the facts a model and a transform need."""

    name: str
    train: Split
    test: Split
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def num_classes(self) -> int:
        """How many classes the labels range over."""
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the stored images."""
        channels, height, width = self.train.images.shape[1:]
        return int(channels), int(height), int(width)
