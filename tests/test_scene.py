import json
from pathlib import Path

import numpy as np
import pytest
from defaults import noise_params

from common.atomic_files import write_npz
from common.errors import ConfigError, SceneError
from data.client_data import client_data
from data.scene import SCENE_FILE, DatasetSource, Scene, SceneSpec, prepare_scene
from settings.compose import compose_config
from settings.run import run_settings

REPO = Path(__file__).resolve().parents[1]


def cfg_for(out_dir: Path, *extra: str):
    return compose_config(["dataset=digits", "num_clients=10", f"out_dir={out_dir}", *extra])


def prepare(cfg):
    """``prepare_scene`` for a composed config, as ``scene.py`` and ``sim.py`` call it."""
    settings = run_settings(cfg)
    return prepare_scene(settings.scene, settings.out_dir)


def test_same_spec_and_seed_give_a_byte_identical_file(tmp_path):
    prepare(cfg_for(tmp_path / "a"))
    prepare(cfg_for(tmp_path / "b"))
    first = (tmp_path / "a" / SCENE_FILE).read_bytes()
    assert first == (tmp_path / "b" / SCENE_FILE).read_bytes()
    prepare(cfg_for(tmp_path / "c", "seed=2"))
    assert first != (tmp_path / "c" / SCENE_FILE).read_bytes()


def test_an_option_left_at_null_is_not_in_the_scene_file_so_earlier_scenes_still_match(tmp_path):
    default, _, _ = prepare(cfg_for(tmp_path / "a"))
    assert "label_pool" not in default.spec["noise"]
    pooled, _, _ = prepare(cfg_for(tmp_path / "b", "noise.label_pool=5"))
    assert pooled.spec["noise"]["label_pool"] == 5
    changed = pooled.noisy_labels != pooled.true_labels
    assert changed.any() and pooled.noisy_labels[changed].max() < 5
    # A scene file written without the key (as before the option existed) is reused as it is.
    again, _, reused = prepare(cfg_for(tmp_path / "a"))
    assert reused and np.array_equal(again.noisy_labels, default.noisy_labels)


def test_scene_contents_are_consistent(tmp_path, digits):
    scene, dataset, reused = prepare(cfg_for(tmp_path, "noise.rho=0.5", "noise.tau=0.3"))
    assert not reused
    assert np.array_equal(np.sort(scene.indices), np.arange(len(dataset.train))), "disjoint and complete"
    assert np.array_equal(scene.true_labels, dataset.train.labels[scene.indices])
    assert scene.client_sizes().sum() == len(dataset.train)
    level, rate = scene.noise_level, scene.true_noise_rate()
    assert np.all(rate[level == 0] == 0)
    assert np.all(rate <= level + 1e-9), "a relabel that hits the true class lowers the realised rate"
    assert (level > 0).any()


def test_changing_the_noise_keeps_the_partition(tmp_path):
    a, _, _ = prepare(cfg_for(tmp_path / "a", "noise.rho=0.2"))
    b, _, _ = prepare(cfg_for(tmp_path / "b", "noise.rho=0.9"))
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.client, b.client)
    assert not np.array_equal(a.noisy_labels, b.noisy_labels)


def test_the_dataset_including_its_test_split_is_never_touched(tmp_path, digits):
    train_before, test_before = digits.train.labels.copy(), digits.test.labels.copy()
    scene, dataset, _ = prepare(cfg_for(tmp_path, "noise=symmetric", "noise.eps=0.5"))
    assert np.array_equal(dataset.train.labels, train_before)
    assert np.array_equal(dataset.test.labels, test_before)
    assert scene.indices.max() < len(dataset.train), "scene indexes the train split only"


def test_an_existing_scene_is_reused_only_for_the_same_spec(tmp_path):
    prepare(cfg_for(tmp_path))
    _, _, reused = prepare(cfg_for(tmp_path))
    assert reused
    with pytest.raises(SceneError, match=r"different config \(noise.rho: 0.6 -> 0.8\)"):
        prepare(cfg_for(tmp_path, "noise.rho=0.8"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],
        lambda raw: b"not a zip file at all",
        lambda raw: raw[:1000] + bytes([raw[1000] ^ 0xFF]) + raw[1001:],
    ],
    ids=["truncated", "garbage", "flipped-byte"],
)
def test_a_corrupt_scene_file_is_a_clear_error(tmp_path, damage):
    prepare(cfg_for(tmp_path))
    path = tmp_path / SCENE_FILE
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(SceneError, match="is corrupt"):
        Scene.load(path)


@pytest.mark.parametrize("spec", ['{"format": 99}', "[1, 2]", "{not json"])
def test_a_scene_with_a_bad_spec_is_corrupt(tmp_path, spec):
    scene, _, _ = prepare(cfg_for(tmp_path))
    arrays = {name: getattr(scene, name)
              for name in ("indices", "client", "noisy_labels", "true_labels", "noise_level")}
    write_npz(tmp_path / "bad.npz", {**arrays, "spec": np.array(spec)})
    with pytest.raises(SceneError, match="is corrupt"):
        Scene.load(tmp_path / "bad.npz")


def test_a_scene_missing_an_array_is_corrupt(tmp_path):
    scene, _, _ = prepare(cfg_for(tmp_path))
    arrays = {name: getattr(scene, name) for name in ("indices", "client", "noisy_labels", "noise_level")}
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(SceneError, match=r"is corrupt \(missing arrays \['true_labels', 'spec'\]\)"):
        Scene.load(tmp_path / "partial.npz")


def test_client_slice_matches_the_scene(tmp_path, digits):
    scene, dataset, _ = prepare(cfg_for(tmp_path))
    for k in (0, 9):
        local = client_data(scene, dataset, k)
        assert len(local) == scene.client_sizes()[k]
        assert np.array_equal(local.images, dataset.train.images[local.indices])
        assert np.array_equal(local.labels, scene.noisy_labels[scene.rows(k)])
    with pytest.raises(ConfigError, match="client 10 does not exist"):
        scene.rows(10)


@pytest.mark.parametrize(
    "override,message",
    [
        ("dataset=imagenet",
         "dataset='imagenet' is invalid: allowed are cifar10, cifar100, cifar100_coarse, clothing1m, digits"),
        ("noise.rho=1.5", "noise.rho=1.5 is invalid"),
        ("noise.tau=-0.1", "noise.tau=-0.1 is invalid"),
        ("partition=fedcorr_noniid partition.p=0", "partition.p=0 is invalid"),
        ("partition=dirichlet partition.alpha=0", "partition.alpha=0 is invalid"),
        ("num_clients=5000", "num_clients=5000 is invalid: allowed is at most the 1437 training samples"),
        ("num_clients=0", "num_clients=0 is invalid"),
        ("dataset.num_classes=7", "dataset.num_classes=7 is invalid: allowed is 10, the classes of the digits data"),
        ("model=transformer", "model='transformer' is invalid"),
    ],
)
def test_bad_input_fails_before_writing_anything(tmp_path, override, message):
    out = tmp_path / "never"
    with pytest.raises(ConfigError, match=message):
        prepare(compose_config(["dataset=digits", "num_clients=10", f"out_dir={out}", *override.split()]))
    assert not out.exists()


def test_clothing1m_refuses_synthetic_noise():
    with pytest.raises(ConfigError, match="use noise=none"):
        run_settings(compose_config(["dataset=clothing1m"]))
    source = DatasetSource("clothing1m", num_classes=14, root=None, download=False, cache_dir=None)
    with pytest.raises(ConfigError, match="use noise=none"):
        SceneSpec.build(source, 10, 1, {"name": "iid"}, {"name": "symmetric", **noise_params("symmetric", eps=0.2)})


def test_a_bare_npy_file_is_not_a_scene(tmp_path):
    with open(tmp_path / SCENE_FILE, "wb") as out:
        np.save(out, np.arange(5))
    with pytest.raises(SceneError, match="is corrupt .*not an .npz"):
        Scene.load(tmp_path / SCENE_FILE)


MIXED = ("noise=mixed", "noise.rho=0.8", "noise.symmetric=0.5", "noise.pairflip=null", "noise.fmnist_asym=0.5")


def test_a_mixed_scene_keeps_each_clients_kind_and_prints_it(tmp_path, capsys):
    import scene as scene_command

    scene, _, _ = prepare(cfg_for(tmp_path, *MIXED))
    noisy = scene.noise_level > 0
    assert all(bool(kind) == noisy[k] for k, kind in enumerate(scene.noise_kind))
    assert {kind for kind in scene.noise_kind if kind} == {"symmetric", "fmnist_asym"}
    for k, kind in enumerate(scene.noise_kind):
        changed = (scene.noisy_labels != scene.true_labels)[scene.rows(k)]
        moved = set(zip(scene.true_labels[scene.rows(k)][changed].tolist(),
                        scene.noisy_labels[scene.rows(k)][changed].tolist()))
        if kind == "fmnist_asym":
            assert moved <= {(0, 6), (6, 0), (2, 4), (5, 7), (9, 7)}
    reloaded = Scene.load(tmp_path / SCENE_FILE)
    assert reloaded.noise_kind == scene.noise_kind
    prepare(cfg_for(tmp_path / "plain"))
    with np.load(tmp_path / "plain" / SCENE_FILE) as plain:
        assert "noise_kind" not in plain.files, "a model that deals no kinds stores none: older scenes keep their bytes"
    assert scene_command.main([f"out_dir={tmp_path}", "dataset=digits", "num_clients=10", *MIXED]) == 0
    printed = capsys.readouterr().out
    header, first = printed.splitlines()[:2]
    assert header.endswith("  kind") and first.split()[-1] == (scene.noise_kind[0] or "-")
    dealt = [kind for kind in scene.noise_kind if kind]
    assert (f"noisy clients by kind: fmnist_asym {dealt.count('fmnist_asym')}, symmetric {dealt.count('symmetric')}"
            in printed)


@pytest.mark.parametrize("kinds,message", [
    (lambda kinds, level: np.array(kinds[:-1]),
     r"noise_kind has dtype <U\d+ and shape \(9,\), not one name per client"),
    (lambda kinds, level: np.where(level > 0, "pairflip2", kinds), r"noise kind 'pairflip2' of noisy client \d is not "
                                                                    r"one of symmetric, pairflip"),
    (lambda kinds, level: np.where(level == 0, "symmetric", kinds), r"clean client \d has noise kind 'symmetric'"),
])
def test_a_scene_with_bad_noise_kinds_is_invalid(tmp_path, kinds, message):
    scene, _, _ = prepare(cfg_for(tmp_path, *MIXED))
    arrays = {name: getattr(scene, name) for name in ("indices", "client", "noisy_labels", "true_labels",
                                                      "noise_level")}
    bad = kinds(np.array(scene.noise_kind), scene.noise_level)
    write_npz(tmp_path / "bad.npz", {**arrays, "noise_kind": bad, "spec": np.array(json.dumps(scene.spec))})
    with pytest.raises(SceneError, match=f"is invalid: {message}"):
        Scene.load(tmp_path / "bad.npz")
