"""`flwr run .` (Flower's own runner, with the local SuperLink it starts) runs the same app and config."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the local SuperLink and its children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and int(proc.name) != os.getpid():
                pids.append(int(proc.name))
    return pids


def flwr_run(tmp_path: Path, overrides: str, supernodes: int = 10) -> subprocess.CompletedProcess:
    """``flwr run . --stream`` with the run-config ``overrides`` on ``supernodes`` local SuperNodes,
    writing to tmp_path/run; its output (``flwr run --stream`` exits 0 even when the ServerApp fails)."""
    home, out = tmp_path / "flwr-home", tmp_path / "run"
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    try:
        done = subprocess.run(
            [str(BIN / "flwr"), "run", ".", "--stream",
             "--run-config", f'overrides="{overrides} out_dir={out}"',
             "--federation-config",
             f"num-supernodes={supernodes} client-resources-num-cpus=1 client-resources-num-gpus=0"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )
    finally:
        # flwr starts a detached local SuperLink (logging under FLWR_HOME); stop it and its children.
        for pid in _pids_mentioning(str(home)):
            os.kill(pid, signal.SIGKILL)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_flwr_run_local_simulation_writes_complete_results(tmp_path):
    done = flwr_run(tmp_path, "experiment=smoke strategy=fedavg strategy.num_rounds=3")
    payload = json.loads((tmp_path / "run" / "results.json").read_text())
    assert payload["complete"] is True and len(payload["rounds"]) == 3
    # It ends as sim.py does: the summary table and where the results are.
    assert f"results: {tmp_path / 'run'}/results.json" in done.stdout + done.stderr
    assert payload["summary"]["best_acc"] > 0.3
    # As in a deployment, the ServerApp has no ground truth unless the run config says so.
    assert payload["config"]["ground_truth"] is False


def test_a_federation_of_another_size_is_refused_in_one_line(tmp_path):
    """5 SuperNodes for a 10-client run: refused once the nodes have connected (not after the 120 s node
    wait), in one line that says what to set, with no traceback."""
    done = flwr_run(tmp_path, "experiment=smoke strategy=fedavg", supernodes=5)
    output = done.stdout + done.stderr
    assert ("error: the simulation has num-supernodes=5 nodes but the run has num_clients=10: set "
            'num-supernodes=10 in the federation config') in output, output[-3000:]
    assert "Traceback" not in output and not (tmp_path / "run" / "results.json").exists()
