"""scikit-learn's bundled 8x8 digits: a small real dataset for fast tests, never downloaded."""

from __future__ import annotations

import functools
import os

import numpy as np

from data.sources.arrays import clean_dataset
from data.sources.base import Dataset

TEST_FRACTION = 0.2
# Fixed so every run and every machine sees the same split; changing it changes all digits results.
SPLIT_SEED = 0
CLASSES = tuple(str(digit) for digit in range(10))


def load_digits(
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """The 1797 digits as uint8 images (1, 8, 8), split 80/20 stratified by class with seed 0.

    Pixel values 0..16 are scaled to 0..255. Mean and std come from the train images on the [0, 1]
    scale. The data ships inside scikit-learn, so ``root``, ``download`` and ``cache_dir`` are
    accepted for a uniform signature and ignored. Built once per process: its arrays are read-only,
    so every caller can share them.
    """
    return _digits()


@functools.cache
def _digits() -> Dataset:
    # Imported here: scikit-learn is slow to import and only this dataset needs it.
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = np.rint(bunch.images * (255 / 16)).astype(np.uint8)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    train_images, test_images, train_labels, test_labels = train_test_split(
        images, labels, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED
    )
    arrays = {
        "train_images": train_images,
        "train_labels": train_labels,
        "test_images": test_images,
        "test_labels": test_labels,
    }
    for array in arrays.values():
        # Read-only like the cached datasets, so code that writes into a dataset fails here too.
        array.setflags(write=False)
    scaled = train_images / 255.0
    return clean_dataset("digits", arrays, CLASSES, (float(scaled.mean()),), (float(scaled.std()),))
