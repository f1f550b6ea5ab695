"""export.py as a user runs it: one local data file per client with the scene's labels, and bad
overrides refused with exit status 2 and nothing written."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.atomic_files import read_npz
from data.local_file import read_local_file
from data.scene import prepare_scene
from settings.compose import compose_config
from settings.run import run_settings

REPO = Path(__file__).resolve().parents[2]


def prepare(overrides: list[str]):
    """``prepare_scene`` for these overrides, as ``export.py`` calls it."""
    settings = run_settings(compose_config(overrides))
    return prepare_scene(settings.scene, settings.out_dir)


def run_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "export.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_export_command_writes_one_file_per_client_with_the_scene_labels(tmp_path):
    out = tmp_path / "run"
    result = run_export("dataset=digits", "num_clients=5", f"out_dir={out}")
    assert result.returncode == 0, result.stderr
    files = sorted((out / "clients").iterdir())
    assert [f.name for f in files] == [f"client_{k}.npz" for k in range(5)]
    assert len(result.stdout.strip().splitlines()) == 6 and "total: 5 client files" in result.stdout
    scene, dataset, reused = prepare(["dataset=digits", "num_clients=5", f"out_dir={out}"])
    assert reused
    sizes = []
    for k, path in enumerate(files):
        local, data, partition_id = read_local_file(path)
        rows = scene.rows(k)
        assert partition_id == k
        assert np.array_equal(data.labels, scene.noisy_labels[rows])
        assert np.array_equal(data.true_labels, scene.true_labels[rows])
        assert np.array_equal(data.images, dataset.train.images[scene.indices[rows]])
        assert (local.classes, local.mean, local.std) == (dataset.classes, dataset.mean, dataset.std)
        sizes.append(len(data))
    assert sum(sizes) == len(dataset.train)
    assert (scene.noisy_labels != scene.true_labels).any(), "the default noise must show in the exported labels"

    again = run_export("dataset=digits", "num_clients=5", f"out_dir={out}", "export.true_labels=false")
    assert again.returncode == 0, again.stderr
    for path in sorted((out / "clients").iterdir()):
        assert "true_labels" not in read_npz(path)
        assert np.all(read_local_file(path)[1].true_labels == -1)


@pytest.mark.parametrize("bad, message", [
    ("noise.rho=1.5", "rho"),
    ("export.true_labels=maybe", "export.true_labels"),
    ("dataset=nope", "dataset"),
])
def test_export_bad_override_exits_2_and_writes_nothing(tmp_path, bad, message):
    result = run_export("dataset=digits", "num_clients=5", f"out_dir={tmp_path / 'run'}", bad)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert not (tmp_path / "run").exists()
