"""deploy/: certificates and node keys; a SuperLink with TLS and SuperNode authentication and 3
SuperNodes as separate processes on localhost (deploy/local_federation.sh), the FedCorr smoke run
through them, and a SuperNode that dies mid-run. Then, on a federation of 10 SuperNodes with state
directories kept up across runs (local_federation.sh --no-run): a ServerApp killed mid-run and
resumed with `flwr run ... resume=true`, a SuperNode killed mid-run that comes back, a SuperLink
killed mid-run and restarted on its database, and a finished run extended to a larger budget
(`extend_from`); each run ends exactly as the same run in simulation.
The federation tests check that every process the federation started is gone afterwards."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from commands import sim
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
        return len(_rounds(self.out))

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


def _rounds(out: Path) -> list[dict]:
    """The rounds a run has recorded so far: rounds.jsonl (results.json lists them only once the run
    is complete); a line cut short by a kill is not a round."""
    rows = []
    try:
        lines = (out / "rounds.jsonl").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def _payload(out: Path) -> dict:
    """results.json, with the rounds so far from rounds.jsonl while the run is not complete."""
    payload = json.loads((out / "results.json").read_text())
    payload.setdefault("rounds", _rounds(out))
    return payload


def _results(federation: LocalFederation) -> dict:
    return _payload(federation.out)


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
    ("local_federation.sh", ["--nodes", "0"], "--nodes '0' is invalid"),
])
def test_scripts_refuse_bad_arguments_before_starting_anything(script, args, message):
    done = _deploy(script, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def _kill_supernode_after_round_one(federation: LocalFederation) -> None:
    """SIGKILL SuperNode 2 and every process under it (a crashed machine) once round 1 is recorded:
    round 2, sent to all 3 clients, is then in flight and node 2 cannot have answered it yet (its
    ClientApp process takes seconds to start)."""
    federation.wait_for("round 1 in results.json", lambda: federation.rounds_done() >= 1, 600)
    _kill(_tree(federation.pid("supernode_2")))


@pytest.fixture(scope="module")
def supernode_killed(tmp_path_factory) -> Iterator[tuple[LocalFederation, Future]]:
    """A federation of 3 running FedAvg (2 rounds of all 3 clients, server.on_client_error=fail) whose
    SuperNode 2 a background thread kills once round 1 is recorded (the future of that kill). The run
    then waits for the SuperLink to give up on the dead node (2 x 30 s of missed heartbeats): started
    first by the smoke test below, this federation spends that wait while the smoke run works."""
    federation = LocalFederation(tmp_path_factory.mktemp("supernode-killed"), "--", "experiment=smoke",
                                 "strategy=fedavg", "strategy.num_rounds=2", "strategy.fraction=1.0",
                                 "server.on_client_error=fail")
    with ThreadPoolExecutor(max_workers=1) as background:
        try:
            yield federation, background.submit(_kill_supernode_after_round_one, federation)
        finally:
            federation.stop()  # also ends the thread's wait, should the test have stopped before the kill


# A deployed run starts a ClientApp process per message: minutes on a loaded 2-core machine, so these
# two tests get more than the suite's 600 s per test (their own waits end them first).
@pytest.mark.timeout(1200)
def test_fedcorr_smoke_runs_over_tls_with_authenticated_supernodes_and_local_data_files(tmp_path, supernode_killed):
    federation = LocalFederation(tmp_path, "--data-files")
    rogue = None
    try:
        # Start-up exports the clients' files and starts three Python processes: 240 s ran out once with
        # the end-to-end tier and two benchmark runs sharing the two cores, so it may take up to 480 s.
        federation.wait_for("3 SuperNodes online", lambda: "SuperNodes online" in federation.output(), 480)
        # The marker finds the federation's processes (so the final check that none is left means something).
        started = {federation.pid(name) for name in ("superlink", "supernode_0", "supernode_1", "supernode_2")}
        assert started <= set(_federation_pids(federation.work))
        # The nodes share this machine's cores: each one's ClientApps get cores / 3 torch threads.
        threads = os.environ.get("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // 3)))
        for k in range(3):  # each node reads its own exported file, not the scene
            cmdline = Path(f"/proc/{federation.pid(f'supernode_{k}')}/cmdline").read_bytes().replace(b"\0", b" ")
            assert f'data-path="{federation.out}/clients/client_{k}.npz"'.encode() in cmdline, cmdline
            environ = Path(f"/proc/{federation.pid(f'supernode_{k}')}/environ").read_bytes().split(b"\0")
            assert f"OMP_NUM_THREADS={threads}".encode() in environ
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


@pytest.mark.timeout(1200)
def test_a_supernode_killed_mid_run_fails_the_run_naming_the_client(supernode_killed):
    """The default policy (server.on_client_error=fail). The SuperLink answers for the dead node once
    its heartbeat is 2 x 30 s overdue; the ServerApp stops naming the client, and the scripts report
    the failed run (`flwr run --stream` alone would exit 0). With server.on_client_error=skip the same
    run completes with clients [0, 1] in round 2 (see deploy/README.md)."""
    federation, killing = supernode_killed
    try:
        killing.result(timeout=600)
        code = federation.finish(timeout=600)
        output = federation.output()
        assert code == 1, output[-5000:]
        assert re.search(r"ended 'finished:failed': .*client 2 failed: .*Node Unavailable", output), output[-5000:]
        payload = _results(federation)
        assert payload["complete"] is False and len(payload["rounds"]) == 1
    finally:
        federation.stop()
    _assert_all_stopped(federation)


# --- A federation that outlives its runs: a ServerApp or a SuperNode dies mid-run -------------------------

NODES = 10
# FedCorr on the smoke scene (digits, 10 clients), as small as its three stages go: 10 stage-1 rounds
# of one client (a checkpoint after round 10, the end of stage 1; the end-of-iteration correction then
# writes the noisy nodes' labels as round 11), 2 finetuning rounds of 3 clients (checkpoint after 12;
# the end-of-stage-2 correction writes labels as round 13) and 1 usual-training round. A deployed
# server has no ground truth; the simulated reference is told the same.
RESUMABLE = ("experiment=smoke", "strategy=fedcorr", "strategy.t1=1", "strategy.t2=2", "strategy.t3=1",
             "strategy.frac2=0.3", f"num_clients={NODES}", "ground_truth=false")
ROUND_KEYS = ("round", "stage", "test_acc", "test_loss", "clients", "comm_cost", "train_loss")
LABELS = "fedcorr-labels"  # client.label_state's record of a node's corrected labels
_VERSION = re.compile(r"^r(\d+)-a(\d+)\.npz$")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run: the same overrides in simulation (sim.py), which gives a deployed run's
    results exactly (rounds, accuracies, losses, FedCorr's block; checked by the tests below) in a
    fraction of its time. Its nodes' state is in <out>/client_state."""
    out = tmp_path_factory.mktemp("reference") / "run"
    done = sim(*RESUMABLE, f"out_dir={out}", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def standing_federation(tmp_path_factory):
    """local_federation.sh --nodes 10 --database --no-run: a SuperLink (TLS, SuperNode authentication,
    its state in WORK/superlink.db) and 10 SuperNodes, node k replaying partition k with its own
    state-dir, kept up for several runs."""
    federation = LocalFederation(tmp_path_factory.mktemp("standing"), "--nodes", str(NODES), "--database",
                                 "--no-run")
    try:
        federation.wait_for(f"{NODES} SuperNodes online", lambda: "federation ready:" in federation.output(), 900)
        yield federation
    finally:
        federation.stop()
    _assert_all_stopped(federation)


def _address(federation: LocalFederation) -> str:
    return re.search(r"SuperLink on (\S+)", federation.output()).group(1)


def _marked(federation: LocalFederation, **variables: str) -> dict[str, str]:
    """The environment of a process a test starts for the federation: marked as one of its processes,
    so that stopping the federation stops it too."""
    return {**os.environ, MARKER: str(federation.work), **variables}


def _online_nodes(federation: LocalFederation) -> int:
    """How many SuperNodes the SuperLink counts online (`flwr supernode list`); 0 while it is down."""
    listed = subprocess.run([str(Path(sys.executable).parent / "flwr"), "supernode", "list", "fedcorr", "--format",
                             "json"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FLWR_HOME": str(federation.work / "home" / "cli")})
    try:
        return sum(node["status"] == "online" for node in json.loads(listed.stdout).get("nodes", []))
    except ValueError:
        return 0


class Submission:
    """deploy/run.sh submitting one run to a standing federation, in the background (one of the
    federation's processes)."""

    def __init__(self, federation: LocalFederation, out: Path, log: Path, *overrides: str) -> None:
        self.log = log
        with open(log, "w") as handle:
            self.process = subprocess.Popen(
                ["bash", str(DEPLOY / "run.sh"), "--superlink", _address(federation), "--root-certificates",
                 str(federation.work / "certs" / "ca.crt"), "--out", str(out), "--", *overrides],
                stdout=handle, stderr=subprocess.STDOUT, env=_marked(federation))

    def output(self) -> str:
        return self.log.read_text()

    def finish(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            _kill(_tree(self.process.pid))
            self.process.wait()


def _wait(what: str, ready, timeout: float, running: Submission, ends: bool = False) -> None:
    """Poll ``ready`` until it holds; fail after ``timeout`` s, or when ``running`` ends first (unless it may)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert ends or running.process.poll() is None, f"run.sh ended before {what}:\n{running.output()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s:\n{running.output()[-3000:]}"
        time.sleep(0.2)


def _program(pid: int) -> str:
    """The name of the program a process runs: ``flwr-serverapp`` for ``python .../bin/flwr-serverapp ...``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    names = [Path(arg.decode(errors="replace")).name for arg in argv[:2]]
    return names[1] if len(names) > 1 and names[0].startswith("python") else names[0]


def _serverapps(federation: LocalFederation) -> set[int]:
    """The running ServerApp processes: with the SuperLink's default subprocess isolation, the SuperLink
    starts a SuperExec (``flower-superexec``), which starts a ``flwr-serverapp`` process per run."""
    return {pid for pid in _tree(federation.pid("superlink"))[1:]
            if _program(pid) == "flwr-serverapp" and _running(pid)}


def _state_versions(federation: LocalFederation, run_key: str) -> list[tuple[int, str, int, int]]:
    """(partition, record, round, attempt) of every state version the SuperNodes hold for run ``run_key``."""
    found = []
    for path in (federation.work / "state").glob(f"node_*/run-{run_key}/partition-*/*/r*-a*.npz"):
        match = _VERSION.match(path.name)
        if match:
            found.append((int(path.parent.parent.name.split("-")[1]), path.parent.name, int(match[1]), int(match[2])))
    return sorted(found)


def _final_labels(run_folders: list[Path]) -> dict[int, np.ndarray]:
    """Each partition's newest corrected labels under the given ``run-<key>`` folders."""
    labels = {}
    for folder in run_folders:
        for partition in folder.glob("partition-*"):
            newest = sorted((partition / LABELS).glob("r*-a*.npz"))
            if newest:
                with np.load(newest[-1]) as arrays:
                    labels[int(partition.name.split("-")[1])] = arrays["labels"]
    return labels


def _run_key(out: Path) -> str:
    return json.loads((out / "checkpoints" / "run.json").read_text())["lineage"]["run"]


def _assert_ends_as_the_reference(federation: LocalFederation, out: Path, reference: Path,
                                  parent: str = "") -> None:
    """The deployed run's results are the uninterrupted simulated run's (all but wall time, out_dir
    and how it started), and so are the labels its nodes corrected (for a run that started from
    another's checkpoint, the newest in the ``parent`` run's folders or its own)."""
    got, want = _payload(out), _payload(reference)
    assert got["complete"] is True
    assert [{key: row[key] for key in ROUND_KEYS} for row in got["rounds"]] == [
        {key: row[key] for key in ROUND_KEYS} for row in want["rounds"]]
    assert {k: v for k, v in got["summary"].items() if k != "wall_s"} == {
        k: v for k, v in want["summary"].items() if k != "wall_s"}
    assert got["fedcorr"] == want["fedcorr"]
    assert got["test_confusion"] == want["test_confusion"]
    assert (out / "fedcorr_clients.csv").read_text() == (reference / "fedcorr_clients.csv").read_text()
    started = ("out_dir", "resume", "extend_from")
    assert {k: v for k, v in got["config"].items() if k not in started} == {
        k: v for k, v in want["config"].items() if k not in started}
    deployed = _final_labels([folder for key in (parent, _run_key(out)) if key
                              for folder in (federation.work / "state").glob(f"node_*/run-{key}")])
    simulated = _final_labels(list((reference / "client_state").glob(f"run-{_run_key(reference)}")))
    assert sorted(deployed) == sorted(simulated) and deployed, (sorted(deployed), sorted(simulated))
    assert all(np.array_equal(deployed[k], simulated[k]) for k in simulated)


def _stage1_end(reference: Path) -> int:
    """The round of the checkpoint at stage 1's end: the number of stage-1 rounds."""
    return sum(row["stage"] == "preprocess" for row in _payload(reference)["rounds"])


def _assert_failed_after_the_stage1_checkpoint(first: Submission, out: Path, stage1_end: int) -> None:
    """The first submission lost its ServerApp: the SuperLink stopped hearing its heartbeat and failed
    the run, run.sh reported it, and the checkpoint on disk is the one of stage 1's end."""
    assert first.finish(timeout=600) == 1, first.output()[-3000:]
    assert "ended 'finished:failed': No heartbeat received from the task" in first.output(), first.output()[-3000:]
    checkpoints = sorted(path.name for path in (out / "checkpoints").iterdir())
    assert checkpoints == [f"round-{stage1_end:07d}-stage.ckpt", "run.json"], checkpoints


def _resume_to_the_end_as_the_reference(federation: LocalFederation, out: Path, log: Path, reference: Path) -> None:
    """The resume step: `resume=true` submitted for the failed run in ``out`` continues after the
    checkpoint of stage 1's end (its first round line is the next round), completes, and ends as the
    uninterrupted simulated run, with the checkpoint it resumed from in its lineage."""
    stage1_end = _stage1_end(reference)
    resumed = Submission(federation, out, log, *RESUMABLE, "resume=true")
    try:
        assert resumed.finish(timeout=3600) == 0, resumed.output()[-5000:]
    finally:
        resumed.stop()
    output = resumed.output()
    assert "finished:completed" in output, output[-3000:]
    assert re.findall(r"\[round +(\d+)/", output)[0] == str(stage1_end + 1), output[-3000:]
    _assert_ends_as_the_reference(federation, out, reference)
    assert json.loads((out / "checkpoints" / "run.json").read_text())["lineage"]["resumed_at"] == [stage1_end]


# A deployed run of 10 nodes starts a ClientApp process per message. Measured on the 2-core machine
# shared with other jobs: 1.5 min for the federation and the reference, then 12, 8 and 7 min for the
# three tests below (a 10-node run took 20 min under a heavier parallel load).
@pytest.mark.recovery
@pytest.mark.timeout(4800)
def test_a_killed_serverapp_resumes_with_flwr_run_and_ends_as_the_uninterrupted_run(
        standing_federation, reference, tmp_path):
    federation, out = standing_federation, tmp_path / "out"
    stage1_end = _stage1_end(reference)
    before = _serverapps(federation)
    first = Submission(federation, out, tmp_path / "first.log", *RESUMABLE)
    try:
        # Past the checkpoint at stage 1's end: a finetuning round is recorded and the next is in flight.
        _wait("a stage-2 round in rounds.jsonl", lambda: len(_rounds(out)) > stage1_end, 3600, first)
        serverapps = _serverapps(federation) - before
        assert len(serverapps) == 1, serverapps
        _kill(list(serverapps))
        recorded = len(_rounds(out))
        _assert_failed_after_the_stage1_checkpoint(first, out, stage1_end)
        assert all(_running(federation.pid(name)) for name in ["superlink", *(f"supernode_{k}" for k in range(NODES))])
        # On disk also: the rounds so far, the nodes' versions of both attempts.
        payload = _payload(out)
        assert payload["complete"] is False and len(payload["rounds"]) == recorded > stage1_end
        run_key = _run_key(out)
        killed_attempt = _state_versions(federation, run_key)
        undone = [v for v in killed_attempt if v[2] > stage1_end]
        # The killed attempt had already corrected its noisy nodes' labels at the start of round 11.
        assert undone and all(record == LABELS and attempt == 1 for _, record, _, attempt in undone), undone

        # A changed config is refused before anything is submitted, naming the key.
        changed = _deploy("run.sh", "--superlink", _address(federation), "--root-certificates",
                          federation.work / "certs" / "ca.crt", "--out", out, "--",
                          *[o.replace("strategy.t3=1", "strategy.t3=2") for o in RESUMABLE], "resume=true")
        assert changed.returncode == 2 and "Differing: strategy.t3 (1 -> 2)" in changed.stderr, changed.stderr
        assert "submitted run" not in changed.stdout
    finally:
        first.stop()
    _resume_to_the_end_as_the_reference(federation, out, tmp_path / "second.log", reference)
    versions = _state_versions(federation, run_key)
    # The nodes' persisted state was used: attempt 2 wrote its own versions after the checkpoint, and
    # every version the killed attempt wrote after it is gone; attempt 1's stage-1 losses (round <= 10),
    # which attempt 2's correction at round 11 split, stay.
    assert any(attempt == 2 for *_, attempt in versions), versions
    assert not [v for v in versions if v[3] == 1 and v[2] > stage1_end], versions
    assert {(p, r) for p, record, r, a in versions if a == 1 and record != LABELS} == {
        (p, r) for p, record, r, a in killed_attempt if record != LABELS}
    assert {(p, r) for p, record, r, a in versions if a == 2 and r == stage1_end + 1} == {
        (p, r) for p, _, r, _ in undone}


@pytest.mark.recovery
@pytest.mark.timeout(4800)
def test_a_supernode_killed_mid_run_rejoins_with_its_saved_state_and_the_run_ends_as_the_uninterrupted_run(
        standing_federation, reference, tmp_path):
    """SIGKILL the SuperNode of the client that trained in round 1 (it holds the local losses of that
    training, which FedCorr's end-of-iteration correction splits at the start of round 11) and restart
    it with the same node config and state-dir. The SuperLink refuses the new process while it still
    counts the dead one online (up to 2 x 30 s heartbeat), then re-admits it under the same node id;
    it is back before the server next addresses it, so the run completes under the default
    server.on_client_error=fail, with the losses the node saved before it died."""
    federation, out = standing_federation, tmp_path / "out"
    want = _payload(reference)
    stage1_end = _stage1_end(reference)
    node = want["rounds"][0]["clients"][0]
    assert node in want["fedcorr"]["detected_noisy_clients"]  # so the correction at round 11 needs its losses
    name = f"supernode_{node}"
    killed = federation.pid(name)
    cmdline = Path(f"/proc/{killed}/cmdline").read_bytes().split(b"\0")
    port = cmdline[cmdline.index(b"--port") + 1].decode()
    running = Submission(federation, out, tmp_path / "run.log", *RESUMABLE)
    restarts: list[subprocess.Popen] = []
    try:
        _wait("round 1 in rounds.jsonl", lambda: len(_rounds(out)) >= 1, 3600, running)
        _kill(_tree(killed))
        killed_at = time.monotonic()
        state = federation.work / "state" / f"node_{node}"
        refused = 0
        while True:  # what an operator (or a supervisor with Restart=on-failure) does
            log = federation.work / "logs" / f"{name}.restart-{len(restarts)}.log"
            with open(log, "w") as handle:
                restarts.append(subprocess.Popen(
                    ["bash", str(DEPLOY / "supernode.sh"), "--superlink", _address(federation),
                     "--root-certificates", str(federation.work / "certs" / "ca.crt"),
                     "--auth-key", str(federation.work / "keys" / f"node_{node}"),
                     "--partition-id", str(node), "--state-dir", str(state), "--port", port],
                    stdout=handle, stderr=subprocess.STDOUT, env=_marked(federation)))
            while restarts[-1].poll() is None and "SuperNode ID:" not in log.read_text():
                time.sleep(0.2)
            if restarts[-1].poll() is None:
                break
            assert "Failed to activate SuperNode" in log.read_text(), log.read_text()
            refused += 1
            assert time.monotonic() - killed_at < 180, "the SuperLink did not re-admit the restarted SuperNode"
            time.sleep(3)
        back_after, rounds_then = time.monotonic() - killed_at, len(_rounds(out))
        (federation.work / "pids" / f"{name}.pid").write_text(f"{restarts[-1].pid}\n")
        assert refused >= 1  # the first restart came while the SuperLink still counted the dead node online
        node_ids = re.findall(r"SuperNode ID: (\d+)", (federation.work / "logs" / f"{name}.log").read_text())
        assert node_ids and f"SuperNode ID: {node_ids[0]}" in log.read_text()  # the same node id as before
        assert rounds_then < stage1_end, f"node {node} came back after {back_after:.0f} s, past round {rounds_then}"
        assert running.finish(timeout=3600) == 0, running.output()[-5000:]
    finally:
        running.stop()
    _assert_ends_as_the_reference(federation, out, reference)
    versions = _state_versions(federation, _run_key(out))
    # The restarted node answered the correction with the losses its first process saved in round 1.
    assert (node, "fedcorr-local-losses", 1, 1) in versions
    assert any(p == node and record == LABELS for p, record, _, _ in versions)
    print(f"node {node} killed after round 1, refused {refused} time(s), back after {back_after:.0f} s "
          f"(round {rounds_then} recorded)")


@pytest.mark.recovery
@pytest.mark.timeout(4800)
def test_a_superlink_killed_mid_run_restarts_on_its_database_and_the_run_resumes(
        standing_federation, reference, tmp_path):
    """SIGKILL the SuperLink and what it started (its SuperExec and the ServerApp): a crashed
    coordinator. The SuperNodes keep retrying; a SuperLink restarted on the same database and port
    knows them (same node ids) and the run, which it marks failed, and run.sh, which kept polling,
    reports it; `resume=true` continues from the checkpoint and ends as the uninterrupted run."""
    federation, out = standing_federation, tmp_path / "out"
    stage1_end = _stage1_end(reference)
    nodes = [federation.pid(f"supernode_{k}") for k in range(NODES)]
    first = Submission(federation, out, tmp_path / "first.log", *RESUMABLE)
    try:
        _wait("a stage-2 round in rounds.jsonl", lambda: len(_rounds(out)) > stage1_end, 3600, first)
        superlink = federation.pid("superlink")
        assert _program(superlink) == "flower-superlink"
        doomed = _tree(superlink)
        assert _serverapps(federation) <= set(doomed)
        _kill(doomed)
        time.sleep(5)
        assert not any(_running(pid) for pid in doomed) and _online_nodes(federation) == 0
        with open(federation.work / "logs" / "superlink.restart.log", "w") as log:
            restarted = subprocess.Popen(
                ["bash", str(DEPLOY / "superlink.sh"), "--certs", str(federation.work / "certs"), "--host", "127.0.0.1",
                 "--port", _address(federation).rsplit(":", 1)[1], "--database", str(federation.work / "superlink.db")],
                stdout=log, stderr=subprocess.STDOUT,
                env=_marked(federation, FLWR_HOME=str(federation.work / "home" / "superlink")))
        (federation.work / "pids" / "superlink.pid").write_text(f"{restarted.pid}\n")
        # (the run may be declared failed, and run.sh end, before the last node is back)
        _wait(f"{NODES} SuperNodes online again", lambda: _online_nodes(federation) == NODES, 600, first, ends=True)
        assert all(_running(pid) for pid in nodes)  # the same SuperNode processes, reconnected
        _assert_failed_after_the_stage1_checkpoint(first, out, stage1_end)
    finally:
        first.stop()
    _resume_to_the_end_as_the_reference(federation, out, tmp_path / "second.log", reference)


# FedCorr with FedDyn as stage 3, whose nodes keep FedDyn's correction term between rounds: at 19
# client participations the run is rounds 1-13 (its last one stage 3's first); at 25 it adds 14-15.
EXTENDABLE = (*(o for o in RESUMABLE if not o.startswith("strategy.t3=")), "strategy.stage3=feddyn")
SHORT, LONG = 19, 25


@pytest.mark.recovery
@pytest.mark.timeout(4800)
def test_a_finished_deployed_run_extends_to_a_larger_budget_and_ends_as_the_run_at_that_budget(
        standing_federation, tmp_path):
    """`extend_from` on a deployment: a run at the shorter budget finishes; a second submission at the
    larger budget with extend_from=<its out_dir> runs only the rounds the budget adds, its nodes
    reading the first run's corrected labels and FedDyn terms from their state-dirs, and ends as the
    run at the larger budget from round 0 in simulation. The first run's node state stays as it was.
    Before that, with one node's state of the first run moved away, the same submission is refused
    before its first round, naming that node's partition."""
    federation, short, out = standing_federation, tmp_path / "short", tmp_path / "out"
    reference = tmp_path / "reference"
    simulated = sim(*EXTENDABLE, f"comm_budget={LONG}", f"out_dir={reference}", timeout=900)
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    first = Submission(federation, short, tmp_path / "short.log", *EXTENDABLE, f"comm_budget={SHORT}")
    try:
        assert first.finish(timeout=3600) == 0, first.output()[-5000:]
    finally:
        first.stop()
    last, parent = _payload(short)["rounds"][-1]["round"], _run_key(short)
    assert 0 < last < _payload(reference)["rounds"][-1]["round"]
    before = _state_versions(federation, parent)
    assert any(record == "feddyn-correction" and r == last for _, record, r, _ in before), before

    # A node whose state-dir lost the first run's state is found before any work, and the run refused.
    lost = max(p for p, record, r, _ in before if record == "answered" and r == last)
    (held,) = (federation.work / "state").glob(f"node_*/run-{parent}/partition-{lost}")
    hidden = tmp_path / "hidden"
    held.rename(hidden)
    refused = Submission(federation, tmp_path / "refused", tmp_path / "refused.log", *EXTENDABLE,
                         f"comm_budget={LONG}", f"extend_from={short}")
    try:
        assert refused.finish(timeout=1200) == 1, refused.output()[-5000:]
    finally:
        refused.stop()
        hidden.rename(held)
    said = refused.output()
    assert (f"is invalid: nodes that hold their state as it was at the checkpoint; the nodes of partitions {lost} "
            f"(answered in round {last}, keeps state up to round 0) do not") in said, said[-3000:]
    assert "[round" not in said

    extended = Submission(federation, out, tmp_path / "out.log", *EXTENDABLE, f"comm_budget={LONG}",
                          f"extend_from={short}")
    try:
        assert extended.finish(timeout=3600) == 0, extended.output()[-5000:]
    finally:
        extended.stop()
    output = extended.output()
    assert f"starting after round {last} of {short} (its last round, to comm_budget={LONG})" in output, output[-3000:]
    assert re.findall(r"\[round +(\d+)/", output)[0] == str(last + 1), output[-3000:]
    _assert_ends_as_the_reference(federation, out, reference, parent=parent)
    assert _payload(out)["attempts"]["extended_from"]["run_dir"] == str(short)
    lineage = json.loads((out / "checkpoints" / "run.json").read_text())["lineage"]
    assert (lineage["parent"], lineage["parent_round"]) == (parent, last)
    assert _state_versions(federation, parent) == before
    own = _state_versions(federation, _run_key(out))
    assert own and all(r > last and attempt == 1 for _, _, r, attempt in own), own
    # A node that kept a FedDyn term in the first run's last round trained again with it.
    kept = {p for p, record, r, _ in before if record == "feddyn-correction" and r == last}
    assert kept & {p for p, record, _, _ in own if record == "feddyn-correction"}, (before, own)
