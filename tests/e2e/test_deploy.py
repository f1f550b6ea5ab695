"""deploy/: certificates and node keys; a SuperLink with TLS and SuperNode authentication and 3
SuperNodes as separate processes on localhost (deploy/local_federation.sh), the FedCorr smoke run
through them, and a SuperNode that dies mid-run. The federation tests check that every process the
federation started is gone afterwards."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_ssh_private_key,
    load_ssh_public_key,
)

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
MARKER = "FEDCORR_FEDERATION"  # local_federation.sh marks every process it starts with this variable

pytestmark = [pytest.mark.skipif(not Path("/proc").is_dir(), reason="process checks read /proc (Linux)")]


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended, only not yet been reaped


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    return children


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children, tree = _children(), [pid]
    for parent in tree:
        tree.extend(children.get(parent, []))
    return tree


def _federation_pids(work: Path) -> list[int]:
    """Running processes that local_federation.sh started for ``work`` (or that they started)."""
    marker = f"{MARKER}={work}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in pids if _running(pid)]


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class LocalFederation:
    """deploy/local_federation.sh running in the background; ``stop()`` ends it and everything it
    started, by pid, whatever state the test left it in."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.work, self.out, self.log = tmp_path / "work", tmp_path / "out", tmp_path / "federation.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                ["bash", str(DEPLOY / "local_federation.sh"), "--work-dir", str(self.work), "--out", str(self.out),
                 *args], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, text=True)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, f"local_federation.sh ended before {what}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def rounds_done(self) -> int:
        try:
            return len(json.loads((self.out / "results.json").read_text())["rounds"])
        except (OSError, ValueError, KeyError):
            return 0

    def pid(self, name: str) -> int:
        return int((self.work / "pids" / f"{name}.pid").read_text())

    def finish(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # its trap stops what it started
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _kill(_federation_pids(self.work))


def _results(federation: LocalFederation) -> dict:
    return json.loads((federation.out / "results.json").read_text())


def _assert_all_stopped(federation: LocalFederation) -> None:
    left = _federation_pids(federation.work)
    assert left == [], f"processes of the federation still running: {left}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _deploy(script: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEPLOY / script), *map(str, args)], check=False, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("backend", ["python", "openssl"])
def test_certificates_chain_to_the_ca_and_name_every_superlink_host(tmp_path, backend):
    if backend == "openssl" and shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (the python backend covers this machine)")
    done = _deploy("make_certs.sh", tmp_path, "--backend", backend, "--server-host", "10.1.2.3",
                   "--server-host", "superlink.example.org")
    assert done.returncode == 0, done.stderr
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "superlink.example.org"} <= set(names.get_values_for_type(x509.DNSName))
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.1.2.3")} <= set(
        names.get_values_for_type(x509.IPAddress))
    server_key = load_pem_private_key((tmp_path / "server.key").read_bytes(), None)
    assert server_key.public_key().public_numbers() == server.public_key().public_numbers()
    assert all((tmp_path / key).stat().st_mode & 0o077 == 0 for key in ("ca.key", "server.key"))
    again = _deploy("make_certs.sh", tmp_path, "--backend", backend)
    assert again.returncode == 2 and "already holds" in again.stderr  # never overwrites a CA


def test_node_keys_are_p384_openssh_pairs_as_flower_reads_them(tmp_path):
    done = _deploy("make_node_keys.sh", tmp_path, 2)
    assert done.returncode == 0, done.stderr
    for k in range(2):
        private = load_ssh_private_key((tmp_path / f"node_{k}").read_bytes(), None)
        public = load_ssh_public_key((tmp_path / f"node_{k}.pub").read_bytes())
        assert isinstance(private.curve, ec.SECP384R1) and (tmp_path / f"node_{k}").stat().st_mode & 0o077 == 0
        assert private.public_key().public_numbers() == public.public_numbers()


@pytest.mark.parametrize(("script", "args", "message"), [
    ("superlink.sh", [], "--certs DIR is required"),
    ("supernode.sh", ["--superlink", "localhost:8000", "--insecure"], "give --data-path FILE"),
    ("supernode.sh", ["--superlink", "localhost", "--insecure", "--partition-id", "0"],
     "is invalid: allowed is HOST:PORT"),
    ("run.sh", ["--superlink", "localhost:8000", "--insecure", "--out", "relative/dir"], "is not absolute"),
    ("local_federation.sh", ["--", "num_clients=5"], "num_clients is 3"),
])
def test_scripts_refuse_bad_arguments_before_starting_anything(script, args, message):
    done = _deploy(script, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


# A deployed run starts a ClientApp process per message: minutes on a loaded 2-core machine, so these
# two tests get more than the suite's 600 s per test (their own waits end them first).
@pytest.mark.timeout(1200)
def test_fedcorr_smoke_runs_over_tls_with_authenticated_supernodes_and_local_data_files(tmp_path):
    federation = LocalFederation(tmp_path, "--data-files")
    rogue = None
    try:
        federation.wait_for("3 SuperNodes online", lambda: "SuperNodes online" in federation.output(), 240)
        # The marker finds the federation's processes (so the final check that none is left means something).
        started = {federation.pid(name) for name in ("superlink", "supernode_0", "supernode_1", "supernode_2")}
        assert started <= set(_federation_pids(federation.work))
        for k in range(3):  # each node reads its own exported file, not the scene
            cmdline = Path(f"/proc/{federation.pid(f'supernode_{k}')}/cmdline").read_bytes().replace(b"\0", b" ")
            assert f'data-path="{federation.out}/clients/client_{k}.npz"'.encode() in cmdline, cmdline
        # A SuperNode whose key was never registered must be turned away, while the run goes on.
        address = re.search(r"SuperLink on (\S+)", federation.output()).group(1)
        subprocess.run(["bash", str(DEPLOY / "make_node_keys.sh"), str(tmp_path / "rogue"), "1"], check=True,
                       capture_output=True)
        rogue_log = tmp_path / "rogue.log"
        with open(rogue_log, "w") as log:
            rogue = subprocess.Popen(
                ["bash", str(DEPLOY / "supernode.sh"), "--superlink", address, "--root-certificates",
                 str(federation.work / "certs" / "ca.crt"), "--auth-key", str(tmp_path / "rogue" / "node_0"),
                 "--partition-id", "0", "--port", str(_free_port())],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, MARKER: str(federation.work)})
        assert rogue.wait(timeout=120) != 0, rogue_log.read_text()
        assert "Failed to initialize the connection to the SuperLink" in rogue_log.read_text(), rogue_log.read_text()

        code = federation.finish(timeout=900)
        output = federation.output()
        assert code == 0, output[-5000:]
        assert "finished:completed" in output
        payload = _results(federation)
        assert payload["complete"] is True
        # 3 stage-1 rounds of one client (frac1 = 1/N), then 1 finetuning and 1 usual round of 2.
        assert [row["stage"] for row in payload["rounds"]] == ["preprocess"] * 3 + ["finetune", "usual"]
        assert [len(row["clients"]) for row in payload["rounds"]] == [1, 1, 1, 2, 2]
        assert sorted(client for row in payload["rounds"][:3] for client in row["clients"]) == [0, 1, 2]
        assert payload["config"]["num_clients"] == 3 and payload["summary"]["best_acc"] > 0.3
        # A deployed server has no ground truth unless the run says so: no label-noise figure it cannot know.
        assert payload["config"]["ground_truth"] is False
        assert {"detection", "label_noise", "relabel_precision"}.isdisjoint(payload["fedcorr"])
        assert sorted(path.name for path in (federation.out / "clients").iterdir()) == [
            "client_0.npz", "client_1.npz", "client_2.npz"]
        superlink_log = (federation.work / "logs" / "superlink.log").read_text()
        assert "Uvicorn running on https://" in superlink_log  # TLS
        assert "SuperNode authentication is disabled" not in superlink_log
    finally:
        if rogue is not None and rogue.poll() is None:
            _kill(_tree(rogue.pid))
            rogue.wait()
        federation.stop()
    _assert_all_stopped(federation)


def _kill_supernode_after_round_one(federation: LocalFederation) -> None:
    """SIGKILL SuperNode 2 and every process under it (a crashed machine) once round 1 is recorded:
    round 2, sent to all 3 clients, is then in flight and node 2 cannot have answered it yet (its
    ClientApp process takes seconds to start)."""
    federation.wait_for("round 1 in results.json", lambda: federation.rounds_done() >= 1, 600)
    _kill(_tree(federation.pid("supernode_2")))


@pytest.mark.timeout(1200)
def test_a_supernode_killed_mid_run_fails_the_run_naming_the_client(tmp_path):
    """The default policy (server.on_client_error=fail). The SuperLink answers for the dead node once
    its heartbeat is 2 x 30 s overdue; the ServerApp stops naming the client, and the scripts report
    the failed run (`flwr run --stream` alone would exit 0). With server.on_client_error=skip the same
    run completes with clients [0, 1] in round 2 (see deploy/README.md)."""
    federation = LocalFederation(tmp_path, "--", "experiment=smoke", "strategy=fedavg", "strategy.num_rounds=2",
                                 "strategy.fraction=1.0", "server.on_client_error=fail")
    try:
        _kill_supernode_after_round_one(federation)
        code = federation.finish(timeout=600)
        output = federation.output()
        assert code == 1, output[-5000:]
        assert re.search(r"ended 'finished:failed': .*client 2 failed: .*Node Unavailable", output), output[-5000:]
        payload = _results(federation)
        assert payload["complete"] is False and len(payload["rounds"]) == 1
    finally:
        federation.stop()
    _assert_all_stopped(federation)
