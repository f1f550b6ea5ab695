"""Uint8 image batches gathered by row index onto a device, and checks on the labels that go with them."""

from __future__ import annotations

import numpy as np
import torch

from common.errors import ConfigError
from data.sources.base import ImageArray

# In-memory arrays up to this size are copied to the device once per call; a client's share of any
# in-memory dataset, or a whole test split, is far below it.
RESIDENT_BYTES = 512 * 2**20


class ImageBatches:
    """Serves uint8 batches (B, C, H, W) of ``images`` on ``device`` for given row indices.

    A small ``np.ndarray`` is copied to the device once, so a batch costs one indexing kernel there
    instead of a NumPy gather and a host-to-device copy; larger or lazy arrays (Clothing1M, decoded on
    demand) are read batch by batch.
    """

    def __init__(self, images: ImageArray, device: torch.device | str) -> None:
        shape = tuple(getattr(images, "shape", ()))
        if len(shape) != 4 or shape[0] < 1:
            raise ConfigError(
                f"images of shape {shape} are invalid: allowed is at least one image, shape (n, C, H, W)"
            )
        if isinstance(images, np.ndarray) and images.dtype != np.uint8:
            raise ConfigError(f"images of dtype {images.dtype} are invalid: allowed is uint8")
        self.device = torch.device(device)
        self._images = images
        self._resident: torch.Tensor | None = None
        if isinstance(images, np.ndarray) and images.nbytes <= RESIDENT_BYTES:
            # torch.tensor copies, so a read-only memory map is never aliased by a writable tensor.
            self._resident = torch.tensor(images).to(self.device)

    def __len__(self) -> int:
        return int(self._images.shape[0])

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """The images at ``rows`` (a 1-D int64 tensor), uint8 on this object's device."""
        if self._resident is not None:
            return self._resident[rows.to(self.device)]
        batch = np.ascontiguousarray(self._images[rows.cpu().numpy()])
        return torch.from_numpy(batch).to(self.device)


def label_tensor(labels: np.ndarray, count: int) -> torch.Tensor:
    """``labels`` as an int64 tensor after checking there is one label >= 0 per image."""
    array = np.asarray(labels)
    if array.shape != (count,) or not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(
            f"labels of shape {array.shape} and dtype {array.dtype} are invalid: "
            f"allowed is one integer label per image, shape ({count},)"
        )
    if array.min() < 0:
        raise ConfigError(f"label {int(array.min())} is invalid: allowed are class indices >= 0")
    return torch.from_numpy(array.astype(np.int64))


def check_labels_fit(top_label: int, num_classes: int) -> None:
    """Raise ConfigError unless the largest label ``top_label`` is a class of a ``num_classes``-way model."""
    if top_label >= num_classes:
        raise ConfigError(
            f"label {top_label} is invalid for a model with {num_classes} outputs: "
            f"allowed are 0..{num_classes - 1}"
        )
