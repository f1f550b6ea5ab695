import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client.node import load_node
from common.atomic_files import read_npz, write_npz
from common.errors import ConfigError, SceneError
from data.client_data import IndexedImages
from data.export import export_clients
from data.local_file import read_local_file, write_local_file
from data.scene import SCENE_FILE, DatasetSource, prepare_scene
from data.sources.base import Split
from export import main as export_main
from settings.compose import compose_config
from settings.run import run_settings

REPO = Path(__file__).resolve().parents[1]
CLASSES = ("a", "b", "c")


def sample(n: int = 6, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(
        images=rng.integers(0, 256, size=(n, 2, 4, 5), dtype=np.uint8),
        labels=rng.integers(0, 3, size=n).astype(np.int64),
        classes=CLASSES, mean=(0.5, 0.25), std=(0.2, 0.1), dataset_name="toy", partition_id=4,
    )


def test_round_trip_keeps_arrays_meta_and_dataset_facts(tmp_path):
    inputs = sample()
    truth = np.array([0, -1, 2, 1, -1, 0])
    write_local_file(tmp_path / "c.npz", **inputs, true_labels=truth)
    dataset, data, partition_id = read_local_file(tmp_path / "c.npz")
    assert partition_id == 4
    assert np.array_equal(data.images, inputs["images"]) and data.images.dtype == np.uint8
    assert np.array_equal(data.labels, inputs["labels"]) and data.labels.dtype == np.int64
    assert np.array_equal(data.true_labels, truth) and data.true_labels.dtype == np.int64
    assert np.array_equal(data.indices, np.arange(6))
    assert (dataset.name, dataset.classes, dataset.mean, dataset.std) == ("toy", CLASSES, (0.5, 0.25), (0.2, 0.1))
    assert dataset.num_classes == 3 and dataset.image_shape == (2, 4, 5)
    assert np.array_equal(dataset.train.images, inputs["images"])
    assert np.array_equal(dataset.train.labels, inputs["labels"])
    assert len(dataset.test) == 0 and dataset.test.images.shape == (0, 2, 4, 5)
    data.labels[0] = (data.labels[0] + 1) % 3  # a client relabelling its copy leaves the dataset as read
    assert dataset.train.labels[0] == inputs["labels"][0]


def test_without_true_labels_every_truth_is_unknown(tmp_path):
    write_local_file(tmp_path / "c.npz", **sample())
    assert "true_labels" not in read_npz(tmp_path / "c.npz")
    dataset, data, _ = read_local_file(tmp_path / "c.npz")
    assert np.all(data.true_labels == -1) and np.all(dataset.train.true_labels == -1)


def test_same_inputs_give_the_same_bytes(tmp_path):
    write_local_file(tmp_path / "a.npz", **sample())
    write_local_file(tmp_path / "b.npz", **{**sample(), "labels": sample()["labels"].astype(np.int32),
                                           "partition_id": np.int64(4)})
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    write_local_file(tmp_path / "c.npz", **sample(seed=1))
    assert (tmp_path / "a.npz").read_bytes() != (tmp_path / "c.npz").read_bytes()


@pytest.mark.parametrize("change, message", [
    (dict(images=np.zeros((6, 2, 4, 5), dtype=np.float32)), "images must be uint8"),
    (dict(labels=np.full(6, 3)), "allowed are 0..2"),
    (dict(labels=np.zeros(5, dtype=np.int64)), "shape (6,)"),
    (dict(mean=(0.5,)), "meta mean"),
    (dict(std=(0.2, 0.0)), "must be positive"),
    (dict(partition_id=-1), "partition_id"),
    (dict(classes=("only",)), "at least 2"),
    (dict(true_labels=np.full(6, -2)), "allowed are -1..2"),
    (dict(images=np.zeros((0, 2, 4, 5), dtype=np.uint8), labels=np.zeros(0, dtype=np.int64)), "no samples"),
])
def test_bad_inputs_are_refused_before_writing(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_local_file(tmp_path / "c.npz", **{**sample(), **change})
    assert list(tmp_path.iterdir()) == []


def test_lazy_images_cannot_be_exported(tmp_path):
    class Lazy:
        shape = (6, 2, 4, 5)

        def __len__(self):
            return 6

        def __getitem__(self, index):
            raise AssertionError("must not decode anything")

    with pytest.raises(ConfigError, match="own image folder"):
        write_local_file(tmp_path / "c.npz", **{**sample(), "images": Lazy()})
    assert list(tmp_path.iterdir()) == []


def _rewrite(path: Path, **changes) -> None:
    arrays = read_npz(path)
    for name, value in changes.items():
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value
    write_npz(path, arrays)


def _meta_with(path: Path, **changes) -> np.ndarray:
    return np.array(json.dumps({**json.loads(str(read_npz(path)["meta"])), **changes}))


@pytest.mark.parametrize("corrupt, message", [
    (lambda p: p.unlink(), "no local data file"),
    (lambda p: p.write_bytes(b"not a zip at all"), "not a readable .npz"),
    (lambda p: p.write_bytes(p.read_bytes()[:200]), "not a readable .npz"),
    (lambda p: np.save(p.with_suffix(".tmp.npy"), np.zeros(3)) or p.with_suffix(".tmp.npy").rename(p),
     "not a readable .npz"),
    (lambda p: _rewrite(p, labels=None), "missing arrays"),
    (lambda p: _rewrite(p, meta=None), "missing arrays"),
    (lambda p: _rewrite(p, labels=read_npz(p)["labels"].astype(np.int32)), "labels must be int64"),
    (lambda p: _rewrite(p, images=read_npz(p)["images"].astype(np.int16)), "images must be uint8"),
    (lambda p: _rewrite(p, images=read_npz(p)["images"][:, 0]), "shape"),
    (lambda p: _rewrite(p, labels=np.full(6, 7, dtype=np.int64)), "allowed are 0..2"),
    (lambda p: _rewrite(p, labels=np.zeros(4, dtype=np.int64)), "like the images"),
    (lambda p: _rewrite(p, true_labels=np.zeros(5, dtype=np.int64)), "like the images"),
    (lambda p: _rewrite(p, meta=np.array("{not json")), "invalid"),
    (lambda p: _rewrite(p, meta=np.array(3)), "meta must be a JSON string"),
    (lambda p: _rewrite(p, meta=_meta_with(p, format=99)), "format-1"),
    (lambda p: _rewrite(p, meta=_meta_with(p, classes="abc")), "meta classes"),
    (lambda p: _rewrite(p, meta=_meta_with(p, std=[0.1])), "meta std"),
    (lambda p: _rewrite(p, meta=_meta_with(p, partition_id="4")), "partition_id"),
    (lambda p: _rewrite(p, meta=_meta_with(p, dataset="")), "meta dataset"),
])
def test_every_corrupt_file_is_a_scene_error_naming_the_file(tmp_path, corrupt, message):
    path = tmp_path / "client_4.npz"
    write_local_file(path, **sample())
    corrupt(path)
    with pytest.raises(SceneError, match=message) as err:
        read_local_file(path)
    assert "client_4.npz" in str(err.value)


def prepare(overrides: list[str]):
    """``prepare_scene`` for these overrides, as ``export.py`` calls it."""
    settings = run_settings(compose_config(overrides))
    return prepare_scene(settings.scene, settings.out_dir)


def test_export_file_names_are_padded_to_sort(tmp_path, digits):
    scene, dataset, _ = prepare(["dataset=digits", "num_clients=11", f"out_dir={tmp_path}"])
    paths = export_clients(scene, dataset, tmp_path / "clients", true_labels=False)
    assert [p.name for p in paths] == [f"client_{k:02d}.npz" for k in range(11)]
    assert [p.name for p in paths] == sorted(p.name for p in paths)


def test_export_refuses_lazy_images_before_writing_the_scene(tmp_path, monkeypatch, capsys, digits):
    lazy = Split(IndexedImages(digits.train.images, np.arange(len(digits.train))), digits.train.labels,
                 digits.train.true_labels)
    monkeypatch.setattr(DatasetSource, "load", lambda source: replace(digits, train=lazy))
    assert export_main(["dataset=digits", "num_clients=5", f"out_dir={tmp_path / 'run'}"]) == 2
    assert "own image folder" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def context_for(node_config: dict, out_dir: Path) -> Context:
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                   run_config={"overrides": f"dataset=digits num_clients=5 out_dir={out_dir}"})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Client files of a digits scene, written by export_clients (the scene itself is then removed,
    as a deployed node never has it)."""
    out = tmp_path_factory.mktemp("deploy")
    scene, dataset, _ = prepare(["dataset=digits", "num_clients=5", f"out_dir={out}"])
    paths = export_clients(scene, dataset, out / "clients", true_labels=False)
    (out / SCENE_FILE).unlink()
    return out, paths, scene


def test_a_deployed_node_loads_its_own_file(exported):
    out, paths, scene = exported
    node = load_node(context_for({"data-path": str(paths[3])}, out))
    assert node.partition_id == 3
    assert np.array_equal(node.data.labels, scene.noisy_labels[scene.rows(3)])
    assert np.all(node.data.true_labels == -1)
    assert node.dataset.image_shape == (1, 8, 8) and node.dataset.num_classes == 10
    logits = node.new_model()(node.eval_transform(torch.from_numpy(node.data.images[:2])))
    assert logits.shape == (2, 10)
    agreeing = load_node(context_for({"data-path": str(paths[3]), "partition-id": 3}, out))
    assert agreeing.partition_id == 3


def test_a_conflicting_partition_id_is_an_error(exported):
    out, paths, _ = exported
    with pytest.raises(ConfigError, match="partition-id=2 disagrees .* 3"):
        load_node(context_for({"data-path": str(paths[3]), "partition-id": 2}, out))


def test_a_node_with_neither_option_names_both(tmp_path):
    with pytest.raises(ConfigError, match="data-path.*partition-id"):
        load_node(context_for({}, tmp_path))


def test_a_file_of_another_dataset_is_refused(exported, tmp_path):
    out, _, _ = exported
    write_local_file(tmp_path / "toy.npz", **sample())
    with pytest.raises(ConfigError, match="dataset=digits"):
        load_node(context_for({"data-path": str(tmp_path / "toy.npz")}, out))
