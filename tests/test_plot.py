"""Partition plots: per-client class counts, the drawn bars, sort order, atomic PNG writing."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest

from common.errors import ConfigError
from data.plot import class_counts, partition_figure, plot_partition

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _partition(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """300 samples over 6 clients and 4 classes."""
    num_clients, num_classes, n = 6, 4, 300
    rng = np.random.default_rng(seed)
    # Skewed client probabilities give clearly different local dataset sizes.
    weights = np.arange(1, num_clients + 1, dtype=float)[rng.permutation(num_clients)]
    client = rng.choice(num_clients, size=n, p=weights / weights.sum())
    return client, rng.integers(0, num_classes, size=n)


def _drawn(fig) -> tuple[np.ndarray, list[int]]:
    """(rows, classes) bar widths as drawn, and the client id of each row, top to bottom."""
    axes = fig.axes[0]
    widths = np.array([[patch.get_width() for patch in container] for container in axes.containers]).T
    lefts = np.array([[patch.get_x() for patch in container] for container in axes.containers]).T
    # Stacked: each class segment starts where the previous one ended.
    np.testing.assert_allclose(lefts[:, 1:], np.cumsum(widths, axis=1)[:, :-1])
    ys = [patch.get_y() + patch.get_height() / 2 for patch in axes.containers[0]]
    bottom, top = axes.get_ylim()
    assert ys == sorted(ys) and bottom > top, "rows are drawn top to bottom in display order"
    return widths, [int(label.get_text()) for label in axes.get_yticklabels()]


def test_class_counts_matches_a_direct_count() -> None:
    client, labels = _partition()
    counts = class_counts(client, labels, 6, 4)
    assert counts.shape == (6, 4)
    for k in range(6):
        for j in range(4):
            assert counts[k, j] == np.sum((client == k) & (labels == j))


def test_class_counts_keeps_empty_clients_and_classes() -> None:
    counts = class_counts(np.array([2, 2, 0]), np.array([1, 1, 3]), num_clients=4, num_classes=5)
    expected = np.zeros((4, 5), dtype=np.int64)
    expected[2, 1], expected[0, 3] = 2, 1
    np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize(
    ("client", "labels", "named"),
    [
        (np.array([0, 6]), np.array([0, 1]), "client contains 6"),
        (np.array([0, -1]), np.array([0, 1]), "client contains -1"),
        (np.array([0, 1]), np.array([0, 4]), "labels contains 4"),
        (np.array([0, 1, 2]), np.array([0, 1]), "3 entries"),
        (np.array([0.0, 1.0]), np.array([0, 1]), "1-D integer"),
    ],
)
def test_class_counts_rejects_bad_ids(client: np.ndarray, labels: np.ndarray, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        class_counts(client, labels, 6, 4)


def test_bars_equal_class_counts_sorted_by_size() -> None:
    client, labels = _partition()
    counts = class_counts(client, labels, 6, 4)
    widths, order = _drawn(partition_figure(counts, title="t"))
    sizes = counts.sum(axis=1)
    assert sorted(order) == list(range(6))
    assert list(sizes[order]) == sorted(sizes, reverse=True), "largest client on top"
    np.testing.assert_array_equal(widths, counts[order])


def test_bars_keep_client_order_when_not_sorting() -> None:
    client, labels = _partition()
    counts = class_counts(client, labels, 6, 4)
    widths, order = _drawn(partition_figure(counts, sort_by_size=False))
    assert order == list(range(6))
    np.testing.assert_array_equal(widths, counts)


def test_noise_panel_follows_the_client_order() -> None:
    client, labels = _partition()
    counts = class_counts(client, labels, 6, 4)
    rates = np.linspace(0.0, 1.0, 6)
    fig = partition_figure(counts, noise_rate=rates)
    _, order = _drawn(fig)
    assert len(fig.axes) >= 2
    drawn = [patch.get_width() for patch in fig.axes[1].containers[0]]
    np.testing.assert_allclose(drawn, rates[order])


def test_plot_partition_writes_a_readable_png(tmp_path) -> None:
    client, labels = _partition()
    path = tmp_path / "partition.png"
    plot_partition(client, labels, 6, 4, path, noise_rate=np.full(6, 0.25), title="IID")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] >= 200 and image.shape[1] >= 400
    assert image[..., :3].std() > 0.05, "the picture is not blank"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["partition.png"], "no temp file left behind"


def test_missing_directory_raises_and_writes_nothing(tmp_path) -> None:
    client, labels = _partition()
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="nope"):
        plot_partition(client, labels, 6, 4, missing / "p.png")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("noise_rate", "named"), [(np.full(5, 0.1), r"shape \(5,\)"), (np.array([0, 0, 0, 0, 0, 1.5]), "1.5")]
)
def test_bad_noise_rate_raises_and_writes_nothing(tmp_path, noise_rate: np.ndarray, named: str) -> None:
    client, labels = _partition()
    with pytest.raises(ConfigError, match=named):
        plot_partition(client, labels, 6, 4, tmp_path / "p.png", noise_rate=noise_rate)
    assert list(tmp_path.iterdir()) == []


def test_failed_render_leaves_no_file(tmp_path, monkeypatch) -> None:
    client, labels = _partition()
    target = tmp_path / "p.png"
    target.write_bytes(b"old")

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", explode)
    with pytest.raises(RuntimeError, match="disk full"):
        plot_partition(client, labels, 6, 4, target)
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"] and target.read_bytes() == b"old"
