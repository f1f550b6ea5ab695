"""A federated scene: partition + noisy labels + ground truth, saved as one reproducible file.

Command line (Hydra overrides, defaults in conf/):
    python -m data.scene dataset=fashion_mnist num_clients=100 partition=iid noise=fedcorr \
        noise.rho=0.6 noise.tau=0.5 seed=1 out_dir=DIR [scene.plot=true]
writes DIR/scene.npz (and DIR/partition.png with scene.plot=true) and prints a per-client summary.
An existing DIR/scene.npz made from the same spec is reused; one made from another spec is an error.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from conf import compose_config
from data.errors import ConfigError, SceneError
from data.noise import NOISE_MODELS, add_noise
from data.npz import read_npz, write_npz
from data.partition import PARTITIONERS, partition
from data.registry import check_int
from data.seeding import rng_for
from data.sources import check_dataset_name, load_dataset
from data.sources.base import Dataset
from data.summary import format_summary

SCENE_FILE = "scene.npz"
FORMAT_VERSION = 1
_PER_SAMPLE = ("indices", "client", "noisy_labels", "true_labels")


@dataclass(frozen=True)
class Scene:
    """Who holds which training sample, with which (noisy) label, and the ground truth.

    Samples are stored grouped by client (client 0's first), each group in dataset order.
    spec: the JSON-able description that made the scene (dataset fingerprint, partition, noise, seed).
    indices: dataset index (into the train split) of each sample.
    client: client id of each sample (non-decreasing).
    noisy_labels: the labels clients train on; true_labels: the correct ones (-1 where unknown).
    noise_level: per-client noise level the noise model was asked for (FedCorr's mu_k).
    """

    spec: dict[str, Any]
    indices: np.ndarray
    client: np.ndarray
    noisy_labels: np.ndarray
    true_labels: np.ndarray
    noise_level: np.ndarray

    @property
    def num_clients(self) -> int:
        return int(self.spec["num_clients"])

    @cached_property
    def offsets(self) -> np.ndarray:
        """Client k's samples are rows ``offsets[k]:offsets[k+1]``."""
        return np.searchsorted(self.client, np.arange(self.num_clients + 1))

    def rows(self, k: int) -> slice:
        """The rows of client ``k`` in the per-sample arrays."""
        if not 0 <= k < self.num_clients:
            raise ConfigError(f"client {k} does not exist: allowed are 0..{self.num_clients - 1}")
        return slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def client_sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def true_noise_rate(self) -> np.ndarray:
        """Per client, the share of samples whose label is wrong, over samples with a known truth
        (NaN for a client with none)."""
        known = self.true_labels >= 0
        wrong = known & (self.noisy_labels != self.true_labels)
        counted = np.bincount(self.client, weights=known, minlength=self.num_clients)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.bincount(self.client, weights=wrong, minlength=self.num_clients) / counted

    def reference_labels(self) -> np.ndarray:
        """The true label where known, else the shipped one: what a sample's class is taken to be."""
        return np.where(self.true_labels >= 0, self.true_labels, self.noisy_labels)

    def save(self, path: str | Path) -> None:
        """Write the scene to ``path`` (same scene, same bytes; never a half-written file)."""
        arrays = {name: getattr(self, name) for name in _PER_SAMPLE}
        arrays["noise_level"] = self.noise_level
        arrays["spec"] = np.array(canonical_json(self.spec))
        write_npz(path, arrays)

    @classmethod
    def load(cls, path: str | Path, expected_spec: dict[str, Any] | None = None) -> Scene:
        """Read a scene file, checking its integrity and, if given, that it was made from ``expected_spec``."""
        path = Path(path)
        if not path.is_file():
            raise SceneError(f"no scene file at {path}; build one with `python -m data.scene out_dir={path.parent}`")
        try:
            arrays = read_npz(path)
            scene = cls._from_arrays(arrays)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as err:
            raise SceneError(
                f"scene file {path} is corrupt ({err}); delete it and build it again with `python -m data.scene`"
            ) from err
        if expected_spec is not None and scene.spec != expected_spec:
            differences = ", ".join(spec_differences(scene.spec, expected_spec))
            raise SceneError(
                f"scene file {path} was made from a different config ({differences}); "
                "use another out_dir or delete the file to rebuild it"
            )
        return scene

    @classmethod
    def _from_arrays(cls, arrays: dict[str, np.ndarray]) -> Scene:
        missing = [name for name in (*_PER_SAMPLE, "noise_level", "spec") if name not in arrays]
        if missing:
            raise ValueError(f"missing arrays {missing}")
        spec = json.loads(str(arrays["spec"]))
        if not isinstance(spec, dict) or spec.get("format") != FORMAT_VERSION:
            raise ValueError(f"spec is not a format-{FORMAT_VERSION} scene spec")
        length = arrays["indices"].shape
        for name in _PER_SAMPLE:
            if arrays[name].ndim != 1 or arrays[name].shape != length or arrays[name].dtype.kind != "i":
                raise ValueError(f"array {name!r} is not a 1-d integer array of length {length[0]}")
        num_clients = int(spec["num_clients"])
        client = arrays["client"]
        if client.size and (client.min() < 0 or client.max() >= num_clients or np.any(np.diff(client) < 0)):
            raise ValueError(f"client ids are not sorted values in 0..{num_clients - 1}")
        if arrays["noise_level"].shape != (num_clients,):
            raise ValueError(f"noise_level does not hold one value per client ({num_clients})")
        return cls(spec, *(arrays[name] for name in _PER_SAMPLE), arrays["noise_level"])


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
    return flat


def spec_differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Human-readable ``key: stored -> wanted`` lines for every key on which two specs differ."""
    old, new = _flatten(stored), _flatten(wanted)
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(old.keys() | new.keys())
            if old.get(key) != new.get(key)]


def scene_spec(cfg: DictConfig) -> dict[str, Any]:
    """Validate the scene part of a config, before any work, and return its spec (sans dataset fingerprint)."""
    check_dataset_name(cfg.dataset.name)
    check_int("num_clients", cfg.num_clients, low=1)
    check_int("seed", cfg.seed, low=0)
    check_int("dataset.num_classes", cfg.dataset.num_classes, low=2)
    part = OmegaConf.to_container(cfg.partition)
    noise = OmegaConf.to_container(cfg.noise)
    PARTITIONERS.check(part["name"], part)
    NOISE_MODELS.check(noise["name"], noise)
    if cfg.dataset.name == "clothing1m" and noise["name"] != "none":
        raise ConfigError(
            f"noise={noise['name']} on clothing1m: its labels already carry real noise; use noise=none"
        )
    return {
        "format": FORMAT_VERSION,
        "dataset": {"name": cfg.dataset.name},
        "num_clients": int(cfg.num_clients),
        "seed": int(cfg.seed),
        "partition": {"name": part["name"], **PARTITIONERS.params(part["name"], part)},
        "noise": {"name": noise["name"], **NOISE_MODELS.params(noise["name"], noise)},
    }


def dataset_fingerprint(dataset: Dataset) -> dict[str, Any]:
    """What identifies the training data a scene indexes into, so a scene is never applied to other data."""
    labels = np.ascontiguousarray(dataset.train.labels, dtype=np.int64)
    return {
        "name": dataset.name,
        "num_train": len(dataset.train),
        "num_classes": dataset.num_classes,
        "labels_sha256": hashlib.sha256(labels.tobytes()).hexdigest(),
    }


def check_dataset_matches(cfg: DictConfig, dataset: Dataset) -> None:
    """The loaded data must fit the config: its class count, and enough samples for every client."""
    if dataset.num_classes != cfg.dataset.num_classes:
        raise ConfigError(
            f"dataset.num_classes={cfg.dataset.num_classes} but {dataset.name} at hand has "
            f"{dataset.num_classes} classes"
        )
    if cfg.num_clients > len(dataset.train):
        raise ConfigError(
            f"num_clients={cfg.num_clients} exceeds the {len(dataset.train)} training samples of "
            f"{dataset.name}: every client needs at least one sample"
        )


def build_scene(spec: dict[str, Any], dataset: Dataset) -> Scene:
    """Draw the partition and the label noise described by ``spec`` (with its dataset fingerprint)."""
    seed, num_clients = spec["seed"], spec["num_clients"]
    shipped = dataset.train.labels
    parts = partition(spec["partition"]["name"], shipped, num_clients, rng_for(seed, "partition"), spec["partition"])
    indices = np.concatenate(parts).astype(np.int64)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), [part.size for part in parts])
    noisy = add_noise(
        spec["noise"]["name"], shipped[indices].astype(np.int64), client, num_clients,
        dataset.num_classes, rng_for(seed, "noise"), spec["noise"],
    )
    true_labels = np.asarray(dataset.train.true_labels)[indices].astype(np.int64)
    return Scene(spec, indices, client, noisy.labels, true_labels, noisy.level.astype(np.float64))


def load_configured_dataset(cfg: DictConfig) -> Dataset:
    """The dataset named in ``cfg.dataset``, from its configured root and cache."""
    return load_dataset(
        cfg.dataset.name, cfg.dataset.root, download=cfg.dataset.download, cache_dir=cfg.dataset.cache_dir
    )


def prepare_scene(cfg: DictConfig) -> tuple[Scene, Dataset, bool]:
    """Build ``<out_dir>/scene.npz`` for ``cfg``, or reuse it if made from the same spec.

    Returns the scene, the dataset and whether an existing file was reused. Every check runs
    before anything is written.
    """
    spec = scene_spec(cfg)
    dataset = load_configured_dataset(cfg)
    check_dataset_matches(cfg, dataset)
    spec["dataset"] = dataset_fingerprint(dataset)
    path = Path(cfg.out_dir) / SCENE_FILE
    if path.exists():
        return Scene.load(path, expected_spec=spec), dataset, True
    scene = build_scene(spec, dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    scene.save(path)
    return scene, dataset, False


def main(argv: list[str]) -> int:
    """Build or reuse the scene for the overrides in ``argv``; print its summary."""
    try:
        cfg = compose_config(argv)
        scene, _, reused = prepare_scene(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = Path(cfg.out_dir) / SCENE_FILE
    print(format_summary(scene))
    print(f"{'reused' if reused else 'wrote'} {path}")
    if cfg.scene.plot:
        from data.plot import plot_partition  # matplotlib is slow to import; only when asked

        png = path.with_name("partition.png")
        plot_partition(
            scene.client, scene.reference_labels(),
            scene.num_clients, int(scene.spec["dataset"]["num_classes"]), png,
            noise_rate=scene.true_noise_rate(), title=f"{scene.spec['dataset']['name']} {scene.spec['partition']}",
        )
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
