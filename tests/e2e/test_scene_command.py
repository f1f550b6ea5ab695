"""scene.py as a user runs it: it writes, reuses and plots a scene, refuses a clashing config and
bad input with exit status 2."""

import subprocess
import sys
from pathlib import Path

import numpy as np

from data.scene import SCENE_FILE

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scene.py", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_contract_writes_reuses_refuses_and_plots(tmp_path):
    out = tmp_path / "scene"
    args = ["dataset=digits", "num_clients=10", "partition=iid", "noise=fedcorr", "noise.rho=0.6",
            "noise.tau=0.5", "seed=1", f"out_dir={out}"]
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert "client" in first.stdout and "true_noise" in first.stdout and f"wrote {out / SCENE_FILE}" in first.stdout
    with np.load(out / SCENE_FILE, allow_pickle=False) as archive:
        assert {"indices", "client", "noisy_labels", "true_labels", "spec"} <= set(archive.files)
    again = run_cli(*args, "scene.plot=true")
    assert again.returncode == 0 and "reused" in again.stdout
    assert (out / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clash = run_cli(*args[:-1], "noise.rho=0.9", f"out_dir={out}")
    assert clash.returncode == 2 and "different config" in clash.stderr and "Traceback" not in clash.stderr
    bad = run_cli("dataset=digits", "noise.rho=2", f"out_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "noise.rho=2 is invalid" in bad.stderr
    assert not (tmp_path / "bad").exists()
