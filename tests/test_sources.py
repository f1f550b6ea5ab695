"""Dataset sources read tiny files written in each dataset's real on-disk format."""

from __future__ import annotations

import gzip
import os
import pickle
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torchvision
from PIL import Image

from common.errors import ConfigError, DatasetNotFoundError
from data.sources import DATASET_NAMES, ImageArray, check_dataset_name, fashion_mnist, load_dataset

REAL_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


# --- writers for the real formats ---------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX encoding of a uint8 array: magic 0x0000 08 <ndim>, big-endian dims, then the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def write_fashion(directory: Path, seed: int = 0, gz: bool = True) -> dict[str, np.ndarray]:
    """Six train and four test images with labels, as Fashion-MNIST's four IDX files."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, 6, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, 4, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(array)))
        else:
            (directory / name).write_bytes(idx_bytes(array))
    return arrays


def write_pickle(path: Path, obj: object) -> None:
    # Protocol 2 with bytes keys, like the Python 2 pickles in the CIFAR archives.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def cifar_batch(rng: np.random.Generator, rows: int, label_key: bytes, num_classes: int) -> dict:
    return {
        b"data": rng.integers(0, 256, (rows, 3072), dtype=np.uint8),
        label_key: rng.integers(0, num_classes, rows).tolist(),
        b"batch_label": b"testing batch",
    }


def write_cifar10(root: Path, rows: int = 2) -> dict[str, dict]:
    rng = np.random.default_rng(1)
    folder = root / "cifar-10-batches-py"
    batches = {f"data_batch_{i}": cifar_batch(rng, rows, b"labels", 10) for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(rng, 3, b"labels", 10)
    for name, batch in batches.items():
        write_pickle(folder / name, batch)
    names = [f"class{i}".encode() for i in range(10)]
    write_pickle(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    return batches


def jpeg(path: Path, color: tuple[int, int, int], height: int, width: int, gray: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (width, height), color)
    (image.convert("L") if gray else image).save(path, format="JPEG", quality=95)


def write_clothing1m(root: Path) -> None:
    train = ["images/0/00/a.jpg", "images/0/01/b.jpg", "images/1/00/c.jpg", "images/1/01/d.jpg"]
    test = ["images/9/00/t.jpg", "images/9/01/u.jpg"]
    jpeg(root / train[0], (255, 0, 0), 40, 30)
    jpeg(root / train[1], (0, 255, 0), 300, 500)
    jpeg(root / train[2], (128, 128, 128), 17, 64, gray=True)
    jpeg(root / train[3], (0, 0, 255), 256, 256)
    for path in test:
        jpeg(root / path, (10, 20, 30), 50, 70)
    categories = "".join(f"Category {i}\n" for i in range(14))
    (root / "category_names_eng.txt").write_text(categories)
    (root / "noisy_label_kv.txt").write_text(
        "".join(f"{key} {label}\n" for key, label in zip(train, [3, 4, 5, 13]))
        + "images/x/unused.jpg 1\n"
    )
    (root / "clean_label_kv.txt").write_text(f"{train[1]} 7\n{test[0]} 2\n{test[1]} 11\n")
    (root / "noisy_train_key_list.txt").write_text("\n".join(train) + "\n")
    (root / "clean_test_key_list.txt").write_text("\n".join(test) + "\n")
    (root / "clean_train_key_list.txt").write_text(f"{train[1]}\n")
    (root / "clean_val_key_list.txt").write_text("")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


# --- registry -------------------------------------------------------------------------------------


def test_unknown_dataset_names_the_bad_name_and_the_allowed_ones() -> None:
    allowed = "fashion_mnist, cifar10, cifar100, cifar100_coarse, clothing1m, digits"
    with pytest.raises(ConfigError, match=f"'mnist'.*{allowed}"):
        check_dataset_name("mnist")
    with pytest.raises(ConfigError, match="dataset=.Fashion-MNIST. is invalid"):
        load_dataset("Fashion-MNIST")
    assert DATASET_NAMES == ("fashion_mnist", "cifar10", "cifar100", "cifar100_coarse", "clothing1m", "digits")


# --- Fashion-MNIST (IDX) --------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_fashion_mnist_reads_idx_files(tmp_path: Path, cache: Path, gz: bool) -> None:
    arrays = write_fashion(tmp_path / "fm", gz=gz)
    data = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    assert data.train.images.shape == (6, 1, 28, 28) and data.train.images.dtype == np.uint8
    np.testing.assert_array_equal(data.train.images[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.test.images[:, 0], arrays["t10k-images-idx3-ubyte"])
    assert data.train.labels.dtype == np.int64
    np.testing.assert_array_equal(data.train.labels, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(data.test.true_labels, arrays["t10k-labels-idx1-ubyte"])
    assert data.num_classes == 10 and data.classes[9] == "Ankle boot"
    assert data.image_shape == (1, 28, 28) and data.mean == (0.2860,) and data.std == (0.3530,)


def test_fashion_mnist_reads_torchvision_layout(tmp_path: Path, cache: Path) -> None:
    arrays = write_fashion(tmp_path / "FashionMNIST" / "raw", gz=False)
    data = load_dataset("fashion_mnist", tmp_path, cache_dir=cache)
    np.testing.assert_array_equal(data.test.labels, arrays["t10k-labels-idx1-ubyte"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: gzip.compress(raw)[:-30], "corrupt or truncated gzip"),
        (lambda raw: gzip.compress(raw[:-5]), "truncated or corrupt"),
        (lambda raw: gzip.compress(b"\x00\x00\x07\x03" + raw[4:]), "bad magic number"),
        (lambda raw: gzip.compress(raw[:10]), "corrupt IDX header"),
    ],
    ids=["gzip", "idx-data", "magic", "idx-header"],
)
def test_corrupt_idx_file_is_an_error_naming_the_file(
    tmp_path: Path, cache: Path, damage, message: str
) -> None:
    arrays = write_fashion(tmp_path)
    bad = tmp_path / "t10k-images-idx3-ubyte.gz"
    bad.write_bytes(damage(idx_bytes(arrays["t10k-images-idx3-ubyte"])))
    with pytest.raises(ConfigError, match=message) as caught:
        load_dataset("fashion_mnist", tmp_path, cache_dir=cache)
    assert str(bad) in str(caught.value)


def test_uncompressed_truncated_idx_is_an_error(tmp_path: Path, cache: Path) -> None:
    write_fashion(tmp_path, gz=False)
    bad = tmp_path / "train-labels-idx1-ubyte"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(ConfigError, match="train-labels-idx1-ubyte: IDX file has 13 bytes"):
        load_dataset("fashion_mnist", tmp_path, cache_dir=cache)


def test_missing_fashion_mnist_lists_every_place_and_how_to_get_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "system")
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "train-images-idx3-ubyte").write_bytes(b"")
    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("fashion_mnist", tmp_path / "partial", cache_dir=tmp_path / "cache")
    message = str(caught.value)
    partial = tmp_path / "partial"
    for place in [partial, partial / "FashionMNIST" / "raw", tmp_path / "system"]:
        assert f"{place}:" in message
    assert "missing train-labels-idx1-ubyte, t10k-images-idx3-ubyte" in message
    assert "does not exist" in message
    assert "apt-get install -y dataset-fashion-mnist" in message and "download=True" in message
    assert isinstance(caught.value, FileNotFoundError)


def test_fashion_mnist_download_uses_torchvision_only_when_allowed(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "system")
    calls = []

    class FakeFashionMNIST:
        def __init__(self, root: str, train: bool, download: bool) -> None:
            calls.append((root, download))
            write_fashion(Path(root) / "FashionMNIST" / "raw")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeFashionMNIST)
    with pytest.raises(DatasetNotFoundError):
        load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    assert calls == []
    data = load_dataset("fashion_mnist", tmp_path / "fm", download=True, cache_dir=cache)
    assert calls == [(str(tmp_path / "fm"), True)] and len(data.train) == 6


def test_failed_download_is_a_not_found_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "system")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    with pytest.raises(DatasetNotFoundError, match=r"download into .*fm: failed .*no network"):
        load_dataset("fashion_mnist", tmp_path / "fm", download=True, cache_dir=tmp_path / "cache")


def test_real_fashion_mnist(cache: Path) -> None:
    if not REAL_FASHION_MNIST.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{REAL_FASHION_MNIST} missing: CI must install dataset-fashion-mnist")
        pytest.skip(f"{REAL_FASHION_MNIST} absent (apt-get install -y dataset-fashion-mnist)")
    data = load_dataset("fashion_mnist", cache_dir=cache)
    assert data.train.images.shape == (60000, 1, 28, 28) and len(data.test) == 10000
    assert np.bincount(data.train.labels).tolist() == [6000] * 10
    assert np.bincount(data.test.labels).tolist() == [1000] * 10
    assert abs(data.train.images[:5000].mean() / 255 - data.mean[0]) < 0.01


# --- cache ----------------------------------------------------------------------------------------


def count_decodes(monkeypatch) -> list[Path]:
    decoded: list[Path] = []
    real = fashion_mnist.read_idx

    def spy(path: Path) -> np.ndarray:
        decoded.append(path)
        return real(path)

    monkeypatch.setattr(fashion_mnist, "read_idx", spy)
    return decoded


def test_second_load_is_memory_mapped_from_the_cache(tmp_path: Path, cache: Path, monkeypatch):
    write_fashion(tmp_path / "fm")
    decoded = count_decodes(monkeypatch)
    first = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    assert len(decoded) == 4
    second = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    assert len(decoded) == 4
    assert isinstance(second.train.images, np.memmap) and second.train.images.mode == "r"
    np.testing.assert_array_equal(first.train.images, second.train.images)
    assert not second.train.labels.flags.writeable
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    write_fashion(tmp_path / "fm")
    monkeypatch.setenv("FEDCORR_CACHE_DIR", str(tmp_path / "env-cache"))
    load_dataset("fashion_mnist", tmp_path / "fm")
    assert len(list((tmp_path / "env-cache").glob("fashion_mnist-*/*.npy"))) == 4


def test_changed_source_invalidates_the_cache(tmp_path: Path, cache: Path) -> None:
    write_fashion(tmp_path / "fm", seed=0)
    load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    arrays = write_fashion(tmp_path / "fm", seed=1)
    for path in (tmp_path / "fm").iterdir():
        # Same sizes as before; a later mtime must be enough even where mtimes are coarse.
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**10))
    data = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    np.testing.assert_array_equal(data.train.images[:, 0], arrays["train-images-idx3-ubyte"])


def test_damaged_cache_entry_is_decoded_again(tmp_path: Path, cache: Path) -> None:
    arrays = write_fashion(tmp_path / "fm")
    load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    (cached,) = cache.glob("fashion_mnist-*/train_images.npy")
    cached.write_bytes(cached.read_bytes()[:100])
    data = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=cache)
    np.testing.assert_array_equal(data.train.images[:, 0], arrays["train-images-idx3-ubyte"])


def test_unwritable_cache_dir_falls_back_to_memory(tmp_path: Path) -> None:
    arrays = write_fashion(tmp_path / "fm")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where a directory is needed: unwritable even for root
    with pytest.warns(RuntimeWarning, match="not writable.*keeping fashion_mnist in memory"):
        data = load_dataset("fashion_mnist", tmp_path / "fm", cache_dir=blocker / "cache")
    assert not isinstance(data.train.images, np.memmap)
    np.testing.assert_array_equal(data.train.images[:, 0], arrays["train-images-idx3-ubyte"])


# --- CIFAR (pickles) ------------------------------------------------------------------------------


def test_cifar10_reads_python_pickles(tmp_path: Path, cache: Path) -> None:
    batches = write_cifar10(tmp_path)
    data = load_dataset("cifar10", tmp_path, cache_dir=cache)
    assert data.train.images.shape == (10, 3, 32, 32) and data.test.images.shape == (3, 3, 32, 32)
    # Rows are channel-major: the first 1024 values are the red plane.
    red = batches["data_batch_2"][b"data"][0, :1024]
    np.testing.assert_array_equal(data.train.images[2, 0].ravel(), red)
    expected = sum((batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), [])
    assert data.train.labels.tolist() == expected and data.train.labels.dtype == np.int64
    assert data.test.true_labels.tolist() == batches["test_batch"][b"labels"]
    assert data.classes == tuple(f"class{i}" for i in range(10))
    assert data.mean == (0.4914, 0.4822, 0.4465) and data.std == (0.2470, 0.2435, 0.2616)


def test_cifar100_uses_fine_labels(tmp_path: Path, cache: Path) -> None:
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-100-python"
    train, test = (cifar_batch(rng, rows, b"fine_labels", 100) for rows in (4, 2))
    for batch in (train, test):
        batch[b"coarse_labels"] = [19] * len(batch[b"fine_labels"])
    write_pickle(folder / "train", train)
    write_pickle(folder / "test", test)
    names = [f"fine{i}".encode() for i in range(100)]
    write_pickle(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": [b"c"] * 20})
    data = load_dataset("cifar100", tmp_path, cache_dir=cache)
    assert data.train.labels.tolist() == train[b"fine_labels"] and data.num_classes == 100
    assert data.test.images.shape == (2, 3, 32, 32) and data.classes[99] == "fine99"
    assert data.mean == (0.5071, 0.4865, 0.4409)


def test_inconsistent_cifar_batch_is_an_error(tmp_path: Path, cache: Path) -> None:
    write_cifar10(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    write_pickle(bad, {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 2, 3]})
    with pytest.raises(ConfigError, match="data_batch_3: expected 2 integer labels"):
        load_dataset("cifar10", tmp_path, cache_dir=cache)
    write_pickle(bad, {b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 10]})
    with pytest.raises(ConfigError, match=r"data_batch_3: labels must lie in \[0, 10\)"):
        load_dataset("cifar10", tmp_path, cache_dir=cache)


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickle_with_foreign_code_is_refused(tmp_path: Path, cache: Path, monkeypatch) -> None:
    write_cifar10(tmp_path)
    write_pickle(tmp_path / "cifar-10-batches-py" / "batches.meta", {b"label_names": Exploit()})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="batches.meta: corrupt or not a CIFAR python pickle"):
        load_dataset("cifar10", tmp_path, cache_dir=cache)
    assert not (tmp_path / "pwned").exists()


def test_missing_cifar_says_where_to_extract_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as caught:
        load_dataset("cifar100", tmp_path / "nowhere", cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert f"{tmp_path / 'nowhere' / 'cifar-100-python'}: does not exist" in message
    assert "cifar-100-python.tar.gz" in message and "download=True" in message


# --- Clothing1M (list files + JPEGs) --------------------------------------------------------------


def test_clothing1m_decodes_only_requested_images(tmp_path: Path, cache: Path) -> None:
    write_clothing1m(tmp_path)
    data = load_dataset("clothing1m", tmp_path, cache_dir=cache)
    images = data.train.images
    assert isinstance(images, ImageArray) and not isinstance(images, np.ndarray)
    assert data.train.images.shape == (4, 3, 256, 256) and len(data.train.images) == 4
    assert data.image_shape == (3, 256, 256) and data.num_classes == 14
    assert data.train.labels.tolist() == [3, 4, 5, 13]
    assert data.train.true_labels.tolist() == [-1, 7, -1, -1]
    assert data.test.labels.tolist() == [2, 11] and data.test.true_labels.tolist() == [2, 11]
    batch = data.train.images[np.array([1, 0, 2])]
    assert batch.shape == (3, 3, 256, 256) and batch.dtype == np.uint8
    # Solid colours survive decoding and resizing; the grayscale JPEG comes back as RGB.
    colours = [[0, 255, 0], [255, 0, 0], [128, 128, 128]]
    np.testing.assert_allclose(batch.mean(axis=(2, 3)), colours, atol=4)
    assert data.test.images[-1].shape == (3, 256, 256)
    assert data.mean == (0.485, 0.456, 0.406)


def test_clothing1m_missing_list_file_is_named(tmp_path: Path, cache: Path) -> None:
    write_clothing1m(tmp_path)
    (tmp_path / "clean_label_kv.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="missing clean_label_kv.txt"):
        load_dataset("clothing1m", tmp_path, cache_dir=cache)


def test_clothing1m_key_without_label_is_an_error(tmp_path: Path, cache: Path) -> None:
    write_clothing1m(tmp_path)
    with (tmp_path / "clean_test_key_list.txt").open("a") as f:
        f.write("images/9/02/orphan.jpg\n")
    message = "clean_test_key_list.txt have no label in clean_label_kv.txt.*orphan"
    with pytest.raises(ConfigError, match=message):
        load_dataset("clothing1m", tmp_path, cache_dir=cache)


def test_clothing1m_missing_image_is_named(tmp_path: Path, cache: Path) -> None:
    write_clothing1m(tmp_path)
    (tmp_path / "images" / "1" / "00" / "c.jpg").unlink()
    data = load_dataset("clothing1m", tmp_path, cache_dir=cache)
    with pytest.raises(DatasetNotFoundError, match="images/1/00/c.jpg"):
        data.train.images[np.array([2])]
    (tmp_path / "images" / "0" / "00" / "a.jpg").unlink()
    with pytest.raises(DatasetNotFoundError, match="images/0/00/a.jpg not found"):
        load_dataset("clothing1m", tmp_path, cache_dir=cache)


def test_clothing1m_without_root_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="(?s)no default location.*Cysu/noisy_label"):
        load_dataset("clothing1m", cache_dir=tmp_path)


# --- digits (scikit-learn) ------------------------------------------------------------------------


def test_digits_split_is_stratified_and_deterministic() -> None:
    data = load_dataset("digits")
    assert data.train.images.shape == (1437, 1, 8, 8) and data.test.images.shape == (360, 1, 8, 8)
    assert data.train.images.dtype == np.uint8 and data.train.labels.dtype == np.int64
    assert data.train.images.max() == 255 and data.classes == tuple("0123456789")
    # Every class keeps its share (within one sample) in the 20 % test split.
    all_counts = np.bincount(data.train.labels) + np.bincount(data.test.labels)
    assert np.all(np.abs(np.bincount(data.test.labels) - 0.2 * all_counts) <= 1)
    again = load_dataset("digits")
    np.testing.assert_array_equal(data.train.images, again.train.images)
    np.testing.assert_array_equal(data.test.labels, again.test.labels)
    assert data.mean[0] == pytest.approx(data.train.images.mean() / 255)
    assert data.std[0] == pytest.approx((data.train.images / 255).std())
