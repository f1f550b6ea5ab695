"""CIFAR-N's human labels: the released label file, read beside tiny CIFAR archives the tests write in
the real format, and the scenes built from it."""

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from inprocess import run
from test_sources import cifar_batch, write_cifar10, write_pickle

from common.errors import ConfigError, DatasetNotFoundError
from data.scene import SCENE_FILE, Scene, prepare_scene
from data.sources import load_dataset
from data.sources.cifar_n import human_labels
from settings.compose import compose_config
from settings.run import run_settings
from strategies.ground_truth import GroundTruth

SETS = {"aggre": "aggre_label", "worst": "worse_label", "random1": "random_label1", "random2": "random_label2",
        "random3": "random_label3"}


def cifar10_train_labels(batches: dict) -> np.ndarray:
    return np.array(sum((batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), []))


def human_sets(clean: np.ndarray, num_classes: int = 10, seed: int = 3) -> dict[str, np.ndarray]:
    """Each set: about 40% of the labels moved to another class, the rest kept."""
    rng = np.random.default_rng(seed)
    return {key: np.where(rng.random(clean.size) < 0.4, (clean + rng.integers(1, num_classes, clean.size))
                          % num_classes, clean) for key in SETS.values()}


def save_label_file(path: Path, content: dict, numpy1_names: bool = False) -> None:
    """``torch.save`` of a dict of numpy arrays, as CIFAR-N releases it; ``numpy1_names``: the pickle
    names numpy 1's module (numpy.core.multiarray), as a file written by numpy 1 does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(content, path)
    if numpy1_names:
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        pickled = next(name for name in members if name.endswith("data.pkl"))
        assert b"numpy._core.multiarray" in members[pickled]
        members[pickled] = members[pickled].replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)


@pytest.fixture
def cifar10n(tmp_path: Path) -> tuple[Path, np.ndarray, dict[str, np.ndarray]]:
    """A CIFAR-10 root of 100 training images with CIFAR-10_human.pt beside cifar-10-batches-py/."""
    root = tmp_path / "data"
    clean = cifar10_train_labels(write_cifar10(root, rows=20))
    sets = human_sets(clean)
    save_label_file(root / "CIFAR-10_human.pt", {"clean_label": clean, **sets})
    return root, clean, sets


@pytest.mark.parametrize("numpy1_names", [False, True])
def test_each_cifar10n_set_is_read_from_the_released_file(tmp_path, cifar10n, numpy1_names):
    root, clean, sets = cifar10n
    save_label_file(root / "CIFAR-10_human.pt", {"clean_label": clean, **sets}, numpy1_names)
    dataset = load_dataset("cifar10", root, cache_dir=tmp_path / "cache")
    for name, key in SETS.items():
        labels = human_labels(dataset, name, root, tmp_path / "cache")
        assert labels.dtype == np.int64 and np.array_equal(labels, sets[key])


def test_the_file_may_sit_inside_the_cifar_folder_and_hold_tensors(tmp_path):
    root = tmp_path / "data"
    clean = cifar10_train_labels(write_cifar10(root, rows=4))
    sets = human_sets(clean)
    save_label_file(root / "cifar-10-batches-py" / "CIFAR-10_human.pt",
                    {"clean_label": torch.tensor(clean), **{key: torch.tensor(v) for key, v in sets.items()}})
    dataset = load_dataset("cifar10", root, cache_dir=tmp_path / "cache")
    assert np.array_equal(human_labels(dataset, "aggre", root, None), sets["aggre_label"])


def write_cifar100(root: Path, rows: int = 30) -> dict:
    rng = np.random.default_rng(5)
    folder = root / "cifar-100-python"
    train, test = (cifar_batch(rng, count, b"fine_labels", 100) for count in (rows, 4))
    for batch in (train, test):
        batch[b"coarse_labels"] = [fine // 5 for fine in batch[b"fine_labels"]]
    write_pickle(folder / "train", train)
    write_pickle(folder / "test", test)
    write_pickle(folder / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                                   b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    return train


def test_cifar100n_fine_and_coarse_read_their_own_labels(tmp_path):
    root = tmp_path / "data"
    train = write_cifar100(root)
    fine, coarse = np.array(train[b"fine_labels"]), np.array(train[b"coarse_labels"])
    noisy_fine, noisy_coarse = (fine + 1) % 100, (coarse + 2) % 20
    save_label_file(root / "CIFAR-100_human.pt", {"clean_label": fine, "noisy_label": noisy_fine,
                                                 "clean_coarse_label": coarse, "noisy_coarse_label": noisy_coarse})
    cache = tmp_path / "cache"
    fine_set, coarse_set = load_dataset("cifar100", root, cache_dir=cache), load_dataset("cifar100_coarse", root,
                                                                                        cache_dir=cache)
    assert coarse_set.num_classes == 20 and coarse_set.classes[19] == "coarse19"
    assert np.array_equal(coarse_set.train.labels, coarse) and np.array_equal(coarse_set.test.true_labels,
                                                                              [f // 5 for f in fine_set.test.labels])
    assert np.array_equal(human_labels(fine_set, "noisy", root, cache), noisy_fine)
    assert np.array_equal(human_labels(coarse_set, "noisy", root, cache), noisy_coarse)


def test_a_missing_file_says_where_it_looked_and_how_to_get_it(tmp_path):
    root = tmp_path / "data"
    write_cifar10(root)
    dataset = load_dataset("cifar10", root, cache_dir=tmp_path / "cache")
    with pytest.raises(DatasetNotFoundError) as caught:
        human_labels(dataset, "worst", root, None)
    message = str(caught.value)
    assert f"{root}: missing CIFAR-10_human.pt" in message
    assert f"{root / 'cifar-10-batches-py'}: missing CIFAR-10_human.pt" in message
    assert "https://github.com/UCSC-REAL/cifar-10-100n" in message and "not downloaded automatically" in message


@pytest.mark.parametrize("content,message", [
    ("clean shifted", r"its clean_label differs from the cifar10 training labels at 100 of 100 samples: it is not "
                      r"the CIFAR-10N file of this CIFAR copy, or its samples are in another order"),
    ("no worst", r"no 'worse_label' entry \(it has clean_label, aggre_label.*\): not a CIFAR-N label file"),
    ("short", r"worse_label must hold 100 integer labels \(one per training image\), got int64 \(99,\)"),
    ("floats", r"worse_label must hold 100 integer labels .* got float64 \(100,\)"),
    ("class 10", r"worse_label must lie in \[0, 10\), got 0..10"),
    ("a list", r"holds a list, not the dict of label arrays of a CIFAR-N file"),
])
def test_a_label_file_that_does_not_fit_is_one_clear_error(tmp_path, cifar10n, content, message):
    root, clean, sets = cifar10n
    bad = {"clean_label": clean, **sets}
    if content == "clean shifted":
        bad["clean_label"] = (clean + 1) % 10
    elif content == "no worst":
        del bad["worse_label"]
    elif content == "short":
        bad["worse_label"] = sets["worse_label"][:-1]
    elif content == "floats":
        bad["worse_label"] = sets["worse_label"].astype(float)
    elif content == "class 10":
        bad["worse_label"] = np.where(np.arange(clean.size) == 0, 10, sets["worse_label"])
    save_label_file(root / "CIFAR-10_human.pt", [clean] if content == "a list" else bad)
    dataset = load_dataset("cifar10", root, cache_dir=tmp_path / "cache")
    with pytest.raises(ConfigError, match=message):
        human_labels(dataset, "worst", root, None)


def test_a_file_that_would_run_code_or_is_not_a_torch_file_is_refused(tmp_path, cifar10n):
    root, clean, _ = cifar10n
    dataset = load_dataset("cifar10", root, cache_dir=tmp_path / "cache")
    torch.save({"clean_label": clean, "worse_label": Path("x")}, root / "CIFAR-10_human.pt")
    with pytest.raises(ConfigError, match=r"CIFAR-10_human.pt: not a readable CIFAR-N label file \(it refers to "
                                          r"pathlib.PosixPath, which a file of label arrays never does\)$"):
        human_labels(dataset, "worst", root, None)
    (root / "CIFAR-10_human.pt").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"not a readable CIFAR-N label file \(not a pickle torch.load reads: "
                                          r"Unsupported operand 110\)$"):
        human_labels(dataset, "worst", root, None)


# --- scenes from human labels ----------------------------------------------------------------------


def human_scene(root: Path, out: Path, *extra: str) -> tuple[Scene, bool]:
    cfg = compose_config(["dataset=cifar10", f"dataset.root={root}", f"dataset.cache_dir={out.parent / 'cache'}",
                          "noise=human", "num_clients=5", f"out_dir={out}", *extra])
    scene, _, reused = prepare_scene(run_settings(cfg).scene, out)
    return scene, reused


def test_a_human_label_scene_keeps_the_clean_labels_as_truth_and_scores_every_client(tmp_path, cifar10n):
    root, clean, sets = cifar10n
    scene, _ = human_scene(root, tmp_path / "run")
    assert np.array_equal(scene.noisy_labels, sets["worse_label"][scene.indices])
    assert np.array_equal(scene.true_labels, clean[scene.indices])
    assert np.allclose(scene.noise_level, scene.true_noise_rate()) and scene.noise_level.min() > 0.2
    truth = GroundTruth.from_scene(scene)
    assert not truth.real_noise and truth.noisy_clients == frozenset(range(5))
    assert scene.spec["dataset"]["label_sets_sha256"].keys() == {"worst"}


def test_with_rho_only_the_chosen_clients_take_human_labels(tmp_path, cifar10n):
    root, clean, sets = cifar10n
    scene, _ = human_scene(root, tmp_path / "run", "noise.labels=random2", "noise.rho=0.5", "seed=4")
    truth = GroundTruth.from_scene(scene)
    assert 0 < len(truth.noisy_clients) < 5 and not truth.real_noise
    for k in range(5):
        rows = scene.rows(k)
        given = sets["random_label2"] if k in truth.noisy_clients else clean
        assert np.array_equal(scene.noisy_labels[rows], given[scene.indices[rows]])


def test_a_scene_is_reused_only_with_the_same_human_labels(tmp_path, cifar10n):
    root, clean, sets = cifar10n
    out = tmp_path / "run"
    human_scene(root, out)
    assert human_scene(root, out)[1], "the same file and set: the scene is reused"
    changed = dict(sets, worse_label=sets["aggre_label"])
    save_label_file(root / "CIFAR-10_human.pt", {"clean_label": clean, **changed})
    with pytest.raises(Exception, match="was made from a different config"):
        human_scene(root, out)
    assert (out / SCENE_FILE).exists()


@pytest.mark.parametrize("overrides,message", [
    (["dataset=fashion_mnist", "noise=human"], r"noise='human' is invalid: allowed with dataset=cifar10, cifar100, "
                                               r"cifar100_coarse only, the datasets CIFAR-N relabelled"),
    (["dataset=cifar10", "noise=human", "noise.labels=noisy"], r"noise.labels='noisy' is invalid: allowed are aggre, "
                                                                r"worst, random1, random2, random3 on cifar10"),
    (["dataset=cifar100", "noise=human"], r"noise.labels='worst' is invalid: allowed are noisy on cifar100 "
                                          r"\(CIFAR-100N\)"),
])
def test_human_labels_on_a_dataset_without_them_are_refused_before_any_data_is_read(overrides, message):
    with pytest.raises(ConfigError, match=message):
        run_settings(compose_config(["dataset.root=/nonexistent", *overrides]))


def test_fedcorr_runs_on_cifar10n_and_scores_its_detection_against_the_clean_labels(tmp_path, cifar10n):
    root, clean, sets = cifar10n
    payload = run([f"dataset.root={root}", f"dataset.cache_dir={tmp_path / 'cache'}", "dataset=cifar10",
                   "noise=human", "noise.labels=aggre", "noise.rho=0.6", "seed=2", "num_clients=5", "model=small_cnn",
                   "strategy=fedcorr", "strategy.t1=1", "strategy.t2=1", "strategy.t3=1", "strategy.frac2=0.4",
                   "strategy.train.batch_size=10", f"out_dir={tmp_path / 'run'}"])
    scene = Scene.load(tmp_path / "run" / SCENE_FILE)
    noisy = sorted(int(k) for k in np.flatnonzero(scene.noise_level > 0))
    report = payload["fedcorr"]
    assert report["true_noisy_clients"] == noisy and 0 < len(noisy) < 5
    assert report["detection"] is not None and report["detection_not_applicable"] is None
    changed = np.mean(sets["aggre_label"][scene.indices] != clean[scene.indices])
    assert report["iterations"][0]["label_noise"] == pytest.approx(np.mean(scene.noisy_labels != scene.true_labels))
    assert 0 < report["iterations"][0]["label_noise"] < changed, "only the clients that took human labels are noisy"
