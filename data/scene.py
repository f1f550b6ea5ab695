"""A federated scene: partition + noisy labels + ground truth, saved as one reproducible file.

``prepare_scene(spec, out_dir)`` writes ``out_dir/scene.npz`` for a ``SceneSpec``, or reuses the file
when it was made from the same spec (one made from another spec is an error). The command line that
composes a spec from the Hydra configuration is ``scene.py`` at the repository root.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic_files import read_npz, write_npz
from common.errors import ConfigError, SceneError
from common.seeding import rng_for
from common.validation import Checked, Flag, FolderPath, Interval, option
from data.noise import MIXED_KINDS, NOISE_MODELS, SceneLabels, add_noise
from data.partition import PARTITIONERS, partition
from data.sources import check_dataset_name, load_dataset
from data.sources import check_root as check_dataset_root
from data.sources.base import Dataset
from data.sources.cifar_n import check_label_set, human_labels

SCENE_FILE = "scene.npz"
FORMAT_VERSION = 1
_PER_SAMPLE = ("indices", "client", "noisy_labels", "true_labels")
# scikit-learn's random_state (FedCorr's GaussianMixture) takes seeds below 2**32 only.
MAX_SEED = 2**32 - 1
SEED = Interval(int, 0, MAX_SEED, reason="the seed feeds scikit-learn's random_state")
"""What a run's seed may be (the scene and the run settings declare it alike)."""


class _BadContents(Exception):
    """A scene file that reads as a format-1 scene but whose arrays break its invariants."""


@dataclass(frozen=True)
class Scene:
    """Who holds which training sample, with which (noisy) label, and the ground truth.

    Samples are stored grouped by client (client 0's first), each group in dataset order.
    spec: the JSON-able description that made the scene (dataset fingerprint, partition, noise, seed).
    indices: dataset index (into the train split) of each sample.
    client: client id of each sample (non-decreasing).
    noisy_labels: the labels clients train on; true_labels: the correct ones (-1 where unknown).
    noise_level: per-client noise level the noise model was asked for (FedCorr's mu_k; under human
        labels, the share of the client's labels that changed).
    noise_kind: per-client kind of noise where the model deals several (``mixed``; "" for a clean
        client), else empty; a scene file stores it only then, so other scenes keep their bytes.
    """

    spec: dict[str, Any]
    indices: np.ndarray
    client: np.ndarray
    noisy_labels: np.ndarray
    true_labels: np.ndarray
    noise_level: np.ndarray
    noise_kind: tuple[str, ...] = ()

    @property
    def num_clients(self) -> int:
        """The number of clients in the scene (from its spec)."""
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
        """Per client, the number of samples it holds."""
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
        if self.noise_kind:
            arrays["noise_kind"] = np.array(self.noise_kind, dtype=str)
        arrays["spec"] = np.array(canonical_json(self.spec))
        write_npz(path, arrays)

    @classmethod
    def load(cls, path: str | Path, expected_spec: dict[str, Any] | None = None) -> Scene:
        """Read a scene file, checking its integrity and, if given, that it was made from ``expected_spec``."""
        path = Path(path)
        if not path.is_file():
            raise SceneError(f"no scene file at {path}; build one with `python scene.py out_dir={path.parent}`")
        try:
            arrays = read_npz(path)
            scene = cls._from_arrays(arrays)
        except _BadContents as err:
            raise SceneError(
                f"scene file {path} is invalid: {err}; delete it and build it again with `python scene.py`"
            ) from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as err:
            raise SceneError(
                f"scene file {path} is corrupt ({err}); delete it and build it again with `python scene.py`"
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
        _check_contents(spec, arrays)
        kinds = tuple(str(kind) for kind in arrays["noise_kind"]) if "noise_kind" in arrays else ()
        return cls(spec, indices=arrays["indices"], client=arrays["client"], noisy_labels=arrays["noisy_labels"],
                   true_labels=arrays["true_labels"], noise_level=arrays["noise_level"], noise_kind=kinds)


def _stored_value(spec: dict[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of a stored spec (None where a level is missing)."""
    value: Any = spec
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _stored_count(spec: dict[str, Any], key: str, low: int) -> int:
    """The integer at dotted ``key`` of a stored spec, which must be >= ``low``."""
    value = _stored_value(spec, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _BadContents(f"its spec has {key}={value!r}, not an integer >= {low}")
    return value


def _check_layout(arrays: dict[str, np.ndarray], num_train: int, num_clients: int) -> None:
    """One integer row per training sample in each per-sample array; one float level per client."""
    for name in _PER_SAMPLE:
        array = arrays[name]
        if array.dtype.kind != "i":
            raise _BadContents(f"{name} has dtype {array.dtype}, not an integer type")
        if array.shape != (num_train,):
            raise _BadContents(f"{name} has shape {array.shape}, not one entry per training sample ({num_train},)")
    level = arrays["noise_level"]
    if level.dtype.kind != "f":
        raise _BadContents(f"noise_level has dtype {level.dtype}, not a float type")
    if level.shape != (num_clients,):
        raise _BadContents(f"noise_level has shape {level.shape}, not one value per client ({num_clients},)")


def _check_within(values: np.ndarray, low: int, high: int, what: str, range_text: str) -> None:
    """Every value lies in [low, high); the first that does not is named."""
    outside = values[(values < low) | (values >= high)]
    if outside.size:
        raise _BadContents(f"{what} {outside[0]} is outside {range_text}")


def _check_contents(spec: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """The arrays must be a scene of the data and federation the file's own spec names.

    The spec's fingerprint is what a reused scene is matched against, so checking the arrays
    against it checks them against the dataset at hand. Every test is one vectorised pass.
    """
    num_train = _stored_count(spec, "dataset.num_train", 1)
    num_classes = _stored_count(spec, "dataset.num_classes", 2)
    num_clients = _stored_count(spec, "num_clients", 1)
    dataset = _stored_value(spec, "dataset.name")
    _check_layout(arrays, num_train, num_clients)
    classes = f"the {num_classes} classes of {dataset}"
    _check_within(arrays["noisy_labels"], 0, num_classes, "noisy label", classes)
    _check_within(arrays["true_labels"], -1, num_classes, "true label", f"{classes} (or -1 for unknown)")
    _check_within(arrays["client"], 0, num_clients, "client id", f"the {num_clients} clients")
    if np.any(np.diff(arrays["client"]) < 0):
        raise _BadContents("client ids are not grouped in increasing order")
    indices = arrays["indices"]
    _check_within(indices, 0, num_train, "sample index", f"the {num_train} training samples of {dataset}")
    repeated = np.flatnonzero(np.bincount(indices, minlength=num_train) > 1)
    if repeated.size:
        raise _BadContents(f"sample index {repeated[0]} appears more than once")
    level = arrays["noise_level"]
    bad = np.flatnonzero(~((level >= 0) & (level <= 1)))  # NaN fails both comparisons
    if bad.size:
        raise _BadContents(f"noise level {level[bad[0]]} of client {bad[0]} is not a number in [0, 1]")
    if "noise_kind" in arrays:
        _check_kinds(arrays["noise_kind"], level)


def _check_kinds(kinds: np.ndarray, level: np.ndarray) -> None:
    """One known kind per noisy client and none for a clean one."""
    if kinds.dtype.kind != "U" or kinds.shape != level.shape:
        raise _BadContents(f"noise_kind has dtype {kinds.dtype} and shape {kinds.shape}, not one name per client")
    for k, kind in enumerate(kinds.tolist()):
        if level[k] > 0 and kind not in MIXED_KINDS:
            raise _BadContents(f"noise kind {kind!r} of noisy client {k} is not one of {', '.join(MIXED_KINDS)}")
        if level[k] == 0 and kind:
            raise _BadContents(f"clean client {k} has noise kind {kind!r}")


def canonical_json(obj: Any) -> str:
    """``obj`` as compact JSON with sorted keys, the same text for equal objects."""
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


@dataclass(frozen=True)
class DatasetSource(Checked):
    """Which dataset to load and from where (``conf/dataset/<name>.yaml``). A root that is set must
    be an existing folder when the data is loaded (see ``check_root``)."""

    name: str = option(meaning="a registered source (data.sources.DATASET_NAMES)")
    num_classes: int = option(Interval(int, 2), "the class count the run expects; the loaded data must agree")
    root: str | None = option(FolderPath(or_none=True), "where to look first (null: the source's own lookup)")
    download: bool = option(Flag(), "allow torchvision to download it")
    cache_dir: str | None = option(FolderPath(or_none=True),
                                   "the decoded-array cache (null: $FEDCORR_CACHE_DIR or the home cache)")

    def check(self) -> None:
        """The name must be a registered source."""
        check_dataset_name(self.name)

    def check_root(self) -> None:
        """Refuse a set ``dataset.root`` that is not a folder (``data.sources.check_root``); reads no data.

        Not run when the source is built: the shipped CIFAR and Clothing1M configs name
        ``./datasets`` roots, and a config must stay valid on a machine that has not fetched the data
        yet (or will download it). ``load`` runs it first; a command may run it earlier.
        """
        check_dataset_root(self.name, self.root, download=self.download)

    def load(self) -> Dataset:
        """The dataset, from its root and cache; a set root that is missing is refused before any
        other place is searched (and so before any scene is built)."""
        self.check_root()
        return load_dataset(self.name, self.root, download=self.download, cache_dir=self.cache_dir)


@dataclass(frozen=True)
class Component:
    """A registered partitioner or noise model by name, with the parameters it takes."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SceneSpec(Checked):
    """Everything a scene is drawn from; checked when built, so a bad value fails before any work."""

    dataset: DatasetSource = option(meaning="the data the scene indexes into")
    num_clients: int = option(Interval(int, 1), "how many clients share the training split")
    seed: int = option(SEED, "the run's seed (partition and noise draw from their own named streams of it)")
    partition: Component = option(meaning="the partitioner and its parameters (data.partition)")
    noise: Component = option(meaning="the label-noise model and its parameters (data.noise)")

    def check(self) -> None:
        """The partitioner and the noise model must take their parameters."""
        PARTITIONERS.check(self.partition.name, self.partition.params)
        NOISE_MODELS.check(self.noise.name, self.noise.params)
        if self.dataset.name == "clothing1m" and self.noise.name != "none":
            raise ConfigError(
                f"noise={self.noise.name} on clothing1m: its labels already carry real noise; use noise=none"
            )
        if self.noise.name == "human":
            check_label_set(self.dataset.name, self.noise.params["labels"])

    def label_sets(self, dataset: Dataset) -> dict[str, np.ndarray]:
        """The label sets the noise model reads beside the dataset's own, by name: for ``human``, the
        human labels it names (read from the CIFAR-N file in the dataset root); none otherwise."""
        if self.noise.name != "human":
            return {}
        which = self.noise.params["labels"]
        return {which: human_labels(dataset, which, self.dataset.root, self.dataset.cache_dir)}

    @classmethod
    def build(cls, dataset: DatasetSource, num_clients: int, seed: int,
              partition: Mapping[str, Any], noise: Mapping[str, Any]) -> SceneSpec:
        """A spec from the ``partition`` and ``noise`` config blocks (``name`` plus parameters; keys
        the named component does not take are dropped)."""
        for kind, block in (("partition", partition), ("noise", noise)):
            if "name" not in block:
                raise ConfigError(f"{kind}.name is missing: the config must name a {kind}")
        PARTITIONERS.check(partition["name"], partition)
        NOISE_MODELS.check(noise["name"], noise)
        return cls(dataset, num_clients, seed,
                   Component(partition["name"], PARTITIONERS.params(partition["name"], partition)),
                   Component(noise["name"], NOISE_MODELS.params(noise["name"], noise)))

    def stored(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """The JSON spec a scene file carries, with the fingerprint of the data it indexes into.
        Parameters at null (options left off) are left out, so adding an option keeps every earlier
        scene file byte-identical and reusable."""
        return {
            "format": FORMAT_VERSION,
            "dataset": fingerprint,
            "num_clients": self.num_clients,
            "seed": self.seed,
            "partition": {"name": self.partition.name, **_set(self.partition.params)},
            "noise": {"name": self.noise.name, **_set(self.noise.params)},
        }


def _set(params: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if value is not None}


def _sha256(labels: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(labels, dtype=np.int64).tobytes()).hexdigest()


def dataset_fingerprint(dataset: Dataset, label_sets: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """What identifies the training data a scene indexes into, so a scene is never applied to other data:
    with the label sets its noise model reads (``SceneSpec.label_sets``), theirs too."""
    fingerprint: dict[str, Any] = {
        "name": dataset.name,
        "num_train": len(dataset.train),
        "num_classes": dataset.num_classes,
        "labels_sha256": _sha256(dataset.train.labels),
    }
    if label_sets:
        fingerprint["label_sets_sha256"] = {name: _sha256(labels) for name, labels in sorted(label_sets.items())}
    return fingerprint


def check_dataset_matches(spec: SceneSpec, dataset: Dataset) -> None:
    """The loaded data must fit the spec: its class count, and enough samples for every client."""
    if dataset.num_classes != spec.dataset.num_classes:
        raise ConfigError(
            f"dataset.num_classes={spec.dataset.num_classes} is invalid: allowed is {dataset.num_classes}, "
            f"the classes of the {dataset.name} data at hand"
        )
    if spec.num_clients > len(dataset.train):
        raise ConfigError(
            f"num_clients={spec.num_clients} is invalid: allowed is at most the {len(dataset.train)} training "
            f"samples of {dataset.name}: every client needs at least one sample"
        )


def build_scene(spec: dict[str, Any], dataset: Dataset, label_sets: Mapping[str, np.ndarray] | None = None) -> Scene:
    """Draw the partition and the label noise described by ``spec`` (with its dataset fingerprint);
    ``label_sets``: what ``SceneSpec.label_sets`` read for the noise model, over the training split."""
    seed, num_clients = spec["seed"], spec["num_clients"]
    shipped = dataset.train.labels
    parts = partition(spec["partition"]["name"], shipped, num_clients, rng_for(seed, "partition"), spec["partition"])
    indices = np.concatenate(parts).astype(np.int64)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), [part.size for part in parts])
    given = SceneLabels(shipped[indices].astype(np.int64), client, num_clients, dataset.num_classes,
                        {name: labels[indices] for name, labels in (label_sets or {}).items()})
    noisy = add_noise(spec["noise"]["name"], given, rng_for(seed, "noise"), spec["noise"])
    true_labels = np.asarray(dataset.train.true_labels)[indices].astype(np.int64)
    return Scene(spec, indices, client, noisy.labels, true_labels, noisy.level.astype(np.float64), noisy.kind)


def planned_scene(spec: SceneSpec, out_dir: str | Path) -> tuple[Scene, Dataset, bool]:
    """The scene ``prepare_scene`` would use, writing nothing: the checked ``<out_dir>/scene.npz`` if it
    exists (made from the same spec), else a fresh build in memory. Returns (scene, dataset, reused),
    so a command can check what a run needs of its clients before any work."""
    dataset = spec.dataset.load()
    check_dataset_matches(spec, dataset)
    label_sets = spec.label_sets(dataset)
    stored = spec.stored(dataset_fingerprint(dataset, label_sets))
    path = Path(out_dir) / SCENE_FILE
    if path.exists():
        return Scene.load(path, expected_spec=stored), dataset, True
    return build_scene(stored, dataset, label_sets), dataset, False


def prepare_scene(spec: SceneSpec, out_dir: str | Path) -> tuple[Scene, Dataset, bool]:
    """Build ``<out_dir>/scene.npz`` for ``spec``, or reuse it if made from the same spec.

    Returns the scene, the dataset and whether an existing file was reused. Every check runs
    before anything is written.
    """
    scene, dataset, reused = planned_scene(spec, out_dir)
    if not reused:
        path = Path(out_dir) / SCENE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        scene.save(path)
    return scene, dataset, reused
