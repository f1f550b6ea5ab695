"""Bad input to the data layer is refused before any work, in one line naming the key and what is allowed.

Covers the partition and noise parameters, the seed, ``dataset.*`` values, a ``dataset.root`` that is
not a folder, and scene files whose arrays were tampered with. Fast: digits only, no Ray, no
subprocesses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from common.atomic_files import read_npz, write_npz
from common.errors import ConfigError, DatasetNotFoundError, InvalidValue, SceneError
from data.scene import SCENE_FILE, DatasetSource, Scene, SceneSpec, prepare_scene
from data.sources import check_root, fashion_mnist
from settings.compose import compose_config
from settings.scene import scene_spec

HUGE = "1" * 400  # an integer literal no float can hold

# (overrides, the key the message must name); each override is a bad value of the data layer.
BAD_VALUES = [
    ("noise=gaussian noise.std=inf", "noise.std"),
    ("noise=gaussian noise.std=nan", "noise.std"),
    ("noise=gaussian noise.std=-0.1", "noise.std"),
    (f"noise=gaussian noise.std={HUGE}", "noise.std"),
    ("noise=gaussian noise.mean=nan", "noise.mean"),
    ("noise=gaussian noise.mean=1.5", "noise.mean"),
    ("noise=gaussian noise.mean=true", "noise.mean"),
    ("noise=gaussian noise.kind=diagonal", "noise.kind"),
    ("noise.rho=nan", "noise.rho"),
    ("noise.rho=inf", "noise.rho"),
    ("noise.rho=-0.1", "noise.rho"),
    ("noise.tau=1.01", "noise.tau"),
    ("noise.tau=half", "noise.tau"),
    ("noise.allow_true_label=1", "noise.allow_true_label"),
    ("noise=symmetric noise.eps=inf", "noise.eps"),
    ("noise=symmetric noise.eps=-inf", "noise.eps"),
    ("noise=pairflip noise.eps=nan", "noise.eps"),
    ("noise=pairflip noise.eps=true", "noise.eps"),
    ("noise=pairflip noise.direction=left", "noise.direction"),
    ("noise=gaussian noise.direction=sideways", "noise.direction"),
    ("noise=symmetric noise.class_balanced=maybe", "noise.class_balanced"),
    ("partition=dirichlet partition.alpha=inf", "partition.alpha"),
    ("partition=dirichlet partition.alpha=nan", "partition.alpha"),
    ("partition=dirichlet partition.alpha=0", "partition.alpha"),
    ("partition=dirichlet partition.alpha=1e7", "partition.alpha"),
    ("partition=dirichlet partition.min_size=0", "partition.min_size"),
    ("partition=dirichlet partition.min_size=2.5", "partition.min_size"),
    ("partition=fedcorr_noniid partition.p=1.5", "partition.p"),
    ("partition=fedcorr_noniid partition.p=0", "partition.p"),
    ("partition=fedcorr_noniid partition.p=nan", "partition.p"),
    ("partition=fedcorr_noniid partition.alpha=inf", "partition.alpha"),
    ("partition=fedcorr_noniid partition.alpha=-1", "partition.alpha"),
    ("partition=shards partition.shards_per_client=0", "partition.shards_per_client"),
    ("partition=shards partition.shards_per_client=true", "partition.shards_per_client"),
    ("partition=shards partition.shards_per_client=1.5", "partition.shards_per_client"),
    ("partition=shards partition.shards_per_client=inf", "partition.shards_per_client"),
    ("seed=4294967296", "seed"),
    ("seed=-1", "seed"),
    ("seed=true", "seed"),
    ("num_clients=0", "num_clients"),
    ("dataset.num_classes=1", "dataset.num_classes"),
    ("dataset.download=yes", "dataset.download"),
    ("dataset.root=5", "dataset.root"),
    ("dataset.cache_dir=''", "dataset.cache_dir"),
]


def spec_for(*overrides: str) -> SceneSpec:
    """The checked scene spec of a digits configuration with ``overrides``."""
    return scene_spec(compose_config(["dataset=digits", "num_clients=10", *overrides]))


def assert_one_line_naming(err: BaseException, key: str) -> None:
    """The project's format: ``<key>=<value> is invalid: allowed ...`` on a single line."""
    message = str(err)
    assert "\n" not in message, message
    assert message.startswith(f"{key}=") and " is invalid: allowed " in message, message


@pytest.mark.parametrize("overrides,key", BAD_VALUES, ids=[case[0][-40:] for case in BAD_VALUES])
def test_a_bad_data_value_is_one_line_naming_its_key(overrides, key):
    with pytest.raises(InvalidValue) as caught:
        spec_for(*overrides.split())
    assert caught.value.key == key
    assert_one_line_naming(caught.value, key)


def test_the_seed_bound_says_why():
    assert spec_for("seed=4294967295").seed == 2**32 - 1
    with pytest.raises(InvalidValue, match=r"<= 4294967295 \(the seed feeds scikit-learn's random_state\)"):
        spec_for("seed=4294967296")


@pytest.mark.parametrize(
    "overrides,key,message",
    [
        ("partition=fedcorr_noniid partition.p=1e-300", "partition.p", r"with 10 classes is a number >= 0\.0001"),
        ("partition=dirichlet partition.min_size=200", "partition.min_size",
         r"partition.min_size=200 is invalid: allowed is at most 143: 10 clients x 200 = 2000 samples exceeds"),
        ("partition=shards partition.shards_per_client=200", "partition.shards_per_client",
         r"shards_per_client=200 is invalid: allowed is at most 143: 10 clients x 200 = 2000 shards exceeds"),
    ],
)
def test_a_parameter_the_data_cannot_meet_is_refused_before_writing(tmp_path, overrides, key, message):
    out = tmp_path / "never"
    with pytest.raises(ConfigError, match=message) as caught:
        prepare_scene(spec_for(*overrides.split()), out)
    assert "\n" not in str(caught.value) and key in str(caught.value)
    assert not out.exists()


def test_the_smallest_allowed_p_builds_quickly(tmp_path):
    scene, _, _ = prepare_scene(spec_for("partition=fedcorr_noniid", "partition.p=0.0001"), tmp_path)
    assert scene.client_sizes().min() >= 1


# --- dataset.root -----------------------------------------------------------------------------------


def test_an_existing_root_passes(tmp_path):
    scene, _, reused = prepare_scene(spec_for(f"dataset.root={tmp_path}"), tmp_path / "out")
    assert not reused and scene.num_clients == 10


@pytest.mark.parametrize("name", ["digits", "fashion_mnist", "cifar10", "clothing1m"])
@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_root_that_is_not_a_folder_is_refused_before_any_scene(tmp_path, name, kind):
    root = tmp_path / "nonexistent"
    if kind == "a file":
        root.write_text("")
    source = DatasetSource(name, num_classes=14 if name == "clothing1m" else 10, root=str(root), download=False,
                           cache_dir=None)
    for attempt in (source.check_root, source.load):  # a command may check before loading anything
        with pytest.raises(InvalidValue) as caught:
            attempt()
        assert caught.value.key == "dataset.root" and caught.value.value == str(root)
        assert_one_line_naming(caught.value, "dataset.root")
        assert "existing folder" in caught.value.allowed


def test_a_missing_root_names_the_lookup_order_it_replaces():
    with pytest.raises(InvalidValue, match=r"or null for the lookup order: /usr/share/datasets/fashion-mnist, then"):
        check_root("fashion_mnist", "/nonexistent")


def test_a_download_may_create_a_missing_root_but_not_replace_a_file(tmp_path):
    check_root("fashion_mnist", str(tmp_path / "new"), download=True)
    check_root("cifar10", str(tmp_path / "new"), download=True)
    with pytest.raises(InvalidValue):
        check_root("clothing1m", str(tmp_path / "new"), download=True)  # Clothing1M cannot be downloaded
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidValue):
        check_root("cifar10", str(tmp_path / "file"), download=True)


def test_a_null_root_keeps_the_lookup_order(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "system")
    source = DatasetSource("fashion_mnist", num_classes=10, root=None, download=False,
                           cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DatasetNotFoundError) as caught:
        source.load()
    assert f"{tmp_path / 'system'}: does not exist" in str(caught.value)
    assert f"{tmp_path / 'cache' / 'downloads' / 'FashionMNIST' / 'raw'}: does not exist" in str(caught.value)


# --- scene files ------------------------------------------------------------------------------------

Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def valid_scene(tmp_path_factory) -> tuple[SceneSpec, Path]:
    """A real scene of the smoke experiment (digits, 10 clients), written once for the module."""
    spec = scene_spec(compose_config(["experiment=smoke"]))
    out = tmp_path_factory.mktemp("scene")
    prepare_scene(spec, out)
    return spec, out / SCENE_FILE


def changed(name: str, edit: Callable[[np.ndarray], np.ndarray]) -> Callable[[Arrays], Arrays]:
    """A tampering that replaces array ``name`` by ``edit`` of a copy of it."""
    return lambda arrays: {**arrays, name: edit(arrays[name].copy())}


def put(index: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    """An edit that sets one entry."""
    def edit(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array
    return edit


def swap_first_and_last(array: np.ndarray) -> np.ndarray:
    array[[0, -1]] = array[[-1, 0]]
    return array


def duplicate_first(array: np.ndarray) -> np.ndarray:
    array[1] = array[0]
    return array


TAMPERINGS = {
    "noisy label too large": (changed("noisy_labels", put(0, 12)),
                              r"noisy label 12 is outside the 10 classes of digits"),
    "noisy label negative": (changed("noisy_labels", put(5, -1)), r"noisy label -1 is outside the 10 classes"),
    "true label too large": (changed("true_labels", put(0, 10)), r"true label 10 is outside the 10 classes"),
    "true label below -1": (changed("true_labels", put(0, -2)), r"true label -2 is outside .* \(or -1 for unknown\)"),
    "negative client": (changed("client", put(0, -1)), r"client id -1 is outside the 10 clients"),
    "client past the federation": (changed("client", put(-1, 10)), r"client id 10 is outside the 10 clients"),
    "clients out of order": (changed("client", swap_first_and_last), r"client ids are not grouped in increasing order"),
    "index past the dataset": (changed("indices", put(0, 1437)),
                               r"sample index 1437 is outside the 1437 training samples of digits"),
    "negative index": (changed("indices", put(0, -3)), r"sample index -3 is outside"),
    "duplicate index": (changed("indices", duplicate_first), r"sample index \d+ appears more than once"),
    "NaN noise level": (changed("noise_level", put(3, np.nan)),
                        r"noise level nan of client 3 is not a number in \[0, 1\]"),
    "infinite noise level": (changed("noise_level", put(0, np.inf)), r"noise level inf of client 0"),
    "noise level above 1": (changed("noise_level", put(9, 1.5)), r"noise level 1.5 of client 9"),
    "float labels": (changed("noisy_labels", lambda a: a.astype(np.float64)),
                     r"noisy_labels has dtype float64, not an integer type"),
    "integer noise levels": (changed("noise_level", lambda a: a.astype(np.int64)),
                             r"noise_level has dtype int64, not a float type"),
    "short labels": (changed("noisy_labels", lambda a: a[:-1]),
                     r"noisy_labels has shape \(1436,\), not one entry per training sample \(1437,\)"),
    "short everything": (lambda arrays: {**arrays, **{n: arrays[n][:-1] for n in
                                                        ("indices", "client", "noisy_labels", "true_labels")}},
                         r"indices has shape \(1436,\)"),
    "2-d client ids": (changed("client", lambda a: a.reshape(1, -1)), r"client has shape \(1, 1437\)"),
    "noise levels for 9 clients": (changed("noise_level", lambda a: a[:9]),
                                   r"noise_level has shape \(9,\), not one value per client \(10,\)"),
}


@pytest.mark.parametrize("tamper,problem", TAMPERINGS.values(), ids=list(TAMPERINGS))
def test_a_tampered_scene_is_refused_with_one_line_naming_the_problem(tmp_path, valid_scene, tamper, problem):
    spec, path = valid_scene
    bad = tmp_path / SCENE_FILE
    write_npz(bad, tamper(read_npz(path)))
    for attempt in (lambda: Scene.load(bad), lambda: prepare_scene(spec, tmp_path)):
        with pytest.raises(SceneError, match=problem) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"scene file {bad} is invalid: "), message


def test_a_spec_without_a_dataset_size_is_refused(tmp_path, valid_scene):
    _, path = valid_scene
    arrays = read_npz(path)
    write_npz(tmp_path / SCENE_FILE, {**arrays, "spec": np.array('{"format": 1, "num_clients": 10}')})
    with pytest.raises(SceneError, match=r"is invalid: its spec has dataset.num_train=None, not an integer >= 1"):
        Scene.load(tmp_path / SCENE_FILE)


def test_an_unknown_true_label_is_valid(tmp_path, valid_scene):
    _, path = valid_scene
    write_npz(tmp_path / SCENE_FILE, changed("true_labels", put(0, -1))(read_npz(path)))
    assert Scene.load(tmp_path / SCENE_FILE).true_labels[0] == -1


def test_a_valid_file_still_loads_identically_and_is_reused(tmp_path, valid_scene):
    spec, path = valid_scene
    arrays = read_npz(path)
    write_npz(tmp_path / SCENE_FILE, arrays)
    assert (tmp_path / SCENE_FILE).read_bytes() == path.read_bytes(), "the rewriting itself changes nothing"
    scene, _, reused = prepare_scene(spec, tmp_path)
    assert reused
    for name in ("indices", "client", "noisy_labels", "true_labels", "noise_level"):
        assert np.array_equal(getattr(scene, name), arrays[name])
        assert getattr(scene, name).dtype == arrays[name].dtype


def test_a_corrupt_zip_is_still_reported_as_corrupt(tmp_path, valid_scene):
    spec, path = valid_scene
    (tmp_path / SCENE_FILE).write_bytes(path.read_bytes()[:2000])
    with pytest.raises(SceneError, match=r"is corrupt .*delete it and build it again"):
        prepare_scene(spec, tmp_path)
