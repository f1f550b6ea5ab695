"""One client's local data: its images and (noisy) labels, cut from a scene and its dataset."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.scene import Scene
from data.sources.base import Dataset, ImageArray


class IndexedImages:
    """A lazy view of some rows of an ImageArray too large to copy (e.g. Clothing1M's JPEGs)."""

    def __init__(self, base: ImageArray, rows: np.ndarray) -> None:
        self.base = base
        self.rows = rows
        self.shape = (rows.size, *base.shape[1:])

    def __len__(self) -> int:
        return int(self.rows.size)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return self.base[self.rows[index]]


@dataclass(frozen=True)
class ClientData:
    """images: uint8 (n, C, H, W); labels: the labels the client trains on (noisy, int64);
    true_labels: ground truth (-1 unknown), for simulation diagnostics only; indices: dataset rows."""

    images: ImageArray
    labels: np.ndarray
    true_labels: np.ndarray
    indices: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def client_data(scene: Scene, dataset: Dataset, k: int) -> ClientData:
    """Client ``k``'s slice; in-memory images are copied out (touching only its pages of a memory map)."""
    rows = scene.rows(k)
    indices = scene.indices[rows]
    images = dataset.train.images
    local = np.ascontiguousarray(images[indices]) if isinstance(images, np.ndarray) else IndexedImages(images, indices)
    return ClientData(local, scene.noisy_labels[rows].copy(), scene.true_labels[rows].copy(), indices)
