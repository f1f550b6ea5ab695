"""Build what training and evaluation need from typed specs: the model and the batch transforms."""

from __future__ import annotations

import torch

from data.sources.base import Dataset
from data.transforms import BatchTransform, TransformPair
from models import ModelSpec, build_model


def model_for(spec: ModelSpec, dataset: Dataset, transforms: TransformPair) -> torch.nn.Module:
    """The network of ``spec``, sized for the dataset's channels and classes and for the images the
    evaluation transform produces (its crop, else the stored size)."""
    channels, height, _ = dataset.image_shape
    return build_model(spec.name, num_classes=dataset.num_classes, in_channels=channels,
                       image_size=int(transforms.eval.crop or height), **spec.options)


def transforms_for(transforms: TransformPair, dataset: Dataset) -> tuple[BatchTransform, BatchTransform]:
    """(train, eval) batch transforms for the dataset's normalisation."""
    return transforms.build(dataset.mean, dataset.std)
