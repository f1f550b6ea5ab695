"""CIFAR-N's human labels (CIFAR-10N, CIFAR-100N) from the label file its authors release.

The file (``CIFAR-10_human.pt`` or ``CIFAR-100_human.pt``) is a ``torch.save`` of a dict of integer
arrays over the 50,000 training images, in the CIFAR python archives' order: the dataset's own labels
under ``clean_label`` (``clean_coarse_label`` for CIFAR-100's superclasses) and each human label set
under its own key. It sits beside the CIFAR folder in the dataset root (or inside that folder). It is
read with ``torch.load(weights_only=True)``, admitting only what integer arrays need, so a file that
is not one cannot run code.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy._core.multiarray import _reconstruct

from common.errors import ConfigError, InvalidValue
from data.sources.base import Dataset
from data.sources.cache import download_root
from data.sources.lookup import Lookup, as_path

RELEASE = "https://github.com/UCSC-REAL/cifar-10-100n"
"""Where CIFAR-N's authors release the label files (their repository's ``data/`` folder)."""


@dataclass(frozen=True)
class HumanLabelFile:
    """Where one dataset's human labels are and what the file calls them.

    title: the label set's name in the CIFAR-N paper; file: the released file; folder: the CIFAR
    folder it sits beside; clean: the key of the dataset's own labels, which must equal the CIFAR
    copy's training labels; sets: the name ``noise.labels`` takes -> the file's key.
    """

    title: str
    file: str
    folder: str
    clean: str
    sets: Mapping[str, str]


HUMAN_LABELS: dict[str, HumanLabelFile] = {
    "cifar10": HumanLabelFile(
        "CIFAR-10N", "CIFAR-10_human.pt", "cifar-10-batches-py", "clean_label",
        {"aggre": "aggre_label", "worst": "worse_label", "random1": "random_label1", "random2": "random_label2",
         "random3": "random_label3"},
    ),
    "cifar100": HumanLabelFile("CIFAR-100N", "CIFAR-100_human.pt", "cifar-100-python", "clean_label",
                               {"noisy": "noisy_label"}),
    "cifar100_coarse": HumanLabelFile("CIFAR-100N", "CIFAR-100_human.pt", "cifar-100-python", "clean_coarse_label",
                                      {"noisy": "noisy_coarse_label"}),
}
"""The datasets CIFAR-N relabelled, by dataset name."""
HUMAN_LABEL_SETS: tuple[str, ...] = tuple(dict.fromkeys(name for spec in HUMAN_LABELS.values() for name in spec.sets))
"""Every name ``noise.labels`` may take (which ones a dataset has: ``check_label_set``)."""


def check_label_set(dataset: str, labels: str) -> None:
    """Refuse human labels on a dataset CIFAR-N did not relabel, or a set that dataset lacks."""
    spec = HUMAN_LABELS.get(dataset)
    if spec is None:
        raise InvalidValue("noise", "human", f"allowed with dataset={', '.join(HUMAN_LABELS)} only, the datasets "
                           f"CIFAR-N relabelled ({dataset} has no human labels)")
    if labels not in spec.sets:
        raise InvalidValue("noise.labels", labels, f"allowed are {', '.join(spec.sets)} on {dataset} ({spec.title})")


def human_labels(
    dataset: Dataset, labels: str, root: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None
) -> np.ndarray:
    """The human label set ``labels`` of ``dataset``'s training split (int64, in its order), from the
    label file in ``root`` (or, without a root, where a download without one would have gone).

    Raises DatasetNotFoundError listing where it looked when the file is missing, and ConfigError when
    it is not a CIFAR-N label file of this CIFAR copy.
    """
    check_label_set(dataset.name, labels)
    spec = HUMAN_LABELS[dataset.name]
    base = as_path(root) if root is not None else download_root(cache_dir)
    lookup = Lookup(spec.title)
    found = lookup.find_all([base, base / spec.folder], [spec.file])
    if found is None:
        raise lookup.error([
            f"download data/{spec.file} from {RELEASE} (the CIFAR-N authors' repository) and put it beside "
            f"{spec.folder}/ in the dataset root (config: dataset.root=...)",
            "it is not downloaded automatically (dataset.download=true fetches only the CIFAR images)",
        ])
    path = found[0]
    content = _read(path)
    num_train, num_classes = len(dataset.train), dataset.num_classes
    clean = _label_array(content, spec.clean, path, num_train, num_classes)
    differ = int(np.count_nonzero(clean != dataset.train.labels))
    if differ:
        raise ConfigError(
            f"{path}: its {spec.clean} differs from the {dataset.name} training labels at {differ} of {num_train} "
            f"samples: it is not the {spec.title} file of this CIFAR copy, or its samples are in another order"
        )
    return _label_array(content, spec.sets[labels], path, num_train, num_classes)


def _label_array(content: Mapping[str, Any], key: str, path: Path, count: int, num_classes: int) -> np.ndarray:
    if key not in content:
        raise ConfigError(f"{path}: no {key!r} entry (it has {', '.join(map(str, content))}): not a CIFAR-N label file")
    value = content[key]
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value).reshape(-1)
    if array.shape != (count,) or not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(f"{path}: {key} must hold {count} integer labels (one per training image), "
                          f"got {array.dtype} {array.shape}")
    if count and (array.min() < 0 or array.max() >= num_classes):
        raise ConfigError(f"{path}: {key} must lie in [0, {num_classes}), got {array.min()}..{array.max()}")
    return array.astype(np.int64)


def _read(path: Path) -> Mapping[str, Any]:
    # Imported here: only a run with human labels reads this file, and the scene command stays torch-free.
    import torch

    try:
        with torch.serialization.safe_globals(_ARRAY_GLOBALS):
            content = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable CIFAR-N label file ({_reason(err)})") from err
    if not isinstance(content, Mapping):
        raise ConfigError(f"{path}: holds a {type(content).__name__}, not the dict of label arrays of a CIFAR-N file")
    return content


def _reason(err: Exception) -> str:
    """The line of a loading error that says what went wrong: for a file that refers to anything but
    arrays, which thing that is."""
    text = str(err)
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if refused:
        return f"it refers to {refused.group(1)}, which a file of label arrays never does"
    unpickler = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    if unpickler:
        return f"not a pickle torch.load reads: {unpickler.group(1).strip()}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


# What unpickling number arrays refers to, under numpy 2's names and numpy 1's (the released files
# were written by numpy 1, whose pickles name numpy.core.multiarray).
_ARRAY_GLOBALS: list[Any] = [
    _reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
    *(type(np.dtype(code)) for code in "?bBhHiIlLqQefd"),
]
