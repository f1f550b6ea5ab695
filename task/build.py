"""Build what training and evaluation need from typed specs: the model and the batch transforms."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from data.sources.base import Dataset
from data.transforms import BatchTransform, TransformPair
from models import ModelSpec, build_model
from models.peer_pair import PeerPair, is_pair_state


def model_for(spec: ModelSpec, dataset: Dataset, transforms: TransformPair) -> torch.nn.Module:
    """The network of ``spec``, sized for the dataset's channels and classes and for the images the
    evaluation transform produces (its crop, else the stored size)."""
    channels, height, _ = dataset.image_shape
    return build_model(spec.name, num_classes=dataset.num_classes, in_channels=channels,
                       image_size=int(transforms.eval.crop or height), **spec.options)


def transforms_for(transforms: TransformPair, dataset: Dataset) -> tuple[BatchTransform, BatchTransform]:
    """(train, eval) batch transforms for the dataset's normalisation."""
    return transforms.build(dataset.mean, dataset.std)


def model_for_state(spec: ModelSpec, dataset: Dataset, transforms: TransformPair,
                    state_keys: Iterable[str]) -> torch.nn.Module:
    """A fresh model that loads a state with ``state_keys``: ``model_for``'s network, or a
    ``PeerPair`` of two of them for a pair's state (Co-teaching's ``first.``/``second.`` keys)."""
    if is_pair_state(state_keys):
        return PeerPair(model_for(spec, dataset, transforms), model_for(spec, dataset, transforms))
    return model_for(spec, dataset, transforms)
