"""Shared fixtures: an isolated dataset cache and small real datasets."""

from __future__ import annotations

import functools
import os
import signal

import pytest

# Flower reports usage to its servers by default; tests must not try to phone home.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> None:
    """One torch thread per test process, as a simulated client has (client.num_threads): the fast
    tier runs a process per core, and two threads each made small models 3-4x slower on 2 cores.
    (A test's in-process run sets the same through the ClientApp; this makes it hold from the start.)"""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def terminal_sigint():
    """SIGINT as under a terminal, even in a test run started with it ignored (a script's background
    job): the Ctrl-C handling keeps an ignored SIGINT ignored, and every child process (sim.py in the
    e2e tests) would inherit it so."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the decoded-dataset cache of the test run out of the user's home directory."""
    os.environ["FEDCORR_CACHE_DIR"] = str(tmp_path_factory.mktemp("dataset-cache"))


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's bundled digits: a small real dataset that needs no download."""
    from data.sources import load_dataset

    return load_dataset("digits")


@pytest.fixture
def flower_identity(monkeypatch):
    """Messages are stamped with the identity Flower gives an app's process; set it as the runtime would."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_run_id", 1), ("_task_id", 2), ("_node_id", 77)):
        monkeypatch.setattr(TaskIdentity, attribute, value)


@pytest.fixture
def incoming(flower_identity):
    """Build a message as a ClientApp receives it: ``incoming(content, "train")``."""
    from flwr.app import Message, Metadata

    def build(content, message_type: str, src_node_id: int = 1):
        metadata = Metadata(run_id=1, message_id="m", src_node_id=src_node_id, dst_node_id=77,
                            reply_to_message_id="", group_id="", created_at=0.0, ttl=600.0,
                            message_type=message_type)
        return Message(content=content, metadata=metadata)

    return build


@functools.cache
def num_clients(overrides: str) -> int:
    """The federation size ``overrides`` compose to."""
    from settings.compose import compose_config

    return int(compose_config(overrides.split())["num_clients"])


@pytest.fixture
def node_context():
    """A simulated node's context, its node config as Flower's simulation runtime gives it:
    ``node_context(overrides, partition_id)``."""
    from flwr.app import Context, RecordDict

    def build(overrides: str, partition_id: int):
        return Context(run_id=1, node_id=77,
                       node_config={"partition-id": partition_id, "num-partitions": num_clients(overrides)},
                       state=RecordDict(), run_config={"overrides": overrides})

    return build


@pytest.fixture(scope="session")
def prepared_run(tmp_path_factory: pytest.TempPathFactory):
    """``prepared_run(overrides)``: the scene for ``overrides`` prepared under a fresh out_dir, as the
    handlers see it: (overrides with that out_dir, the scene, the initial global arrays)."""
    from data.scene import prepare_scene
    from server.run import initial_arrays
    from settings.compose import compose_config
    from settings.run import run_settings

    def prepare(overrides: str):
        overrides = f"{overrides} out_dir={tmp_path_factory.mktemp('run')}"
        settings = run_settings(compose_config(overrides.split()))
        scene, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
        return overrides, scene, initial_arrays(settings, dataset)

    return prepare


@pytest.fixture
def local_grid(flower_identity):
    """``local_grid(overrides, num_nodes, client_app=the project's)``: a ``tests.grid.LocalGrid`` whose
    nodes run the ClientApp in this process with the run config of ``overrides``."""
    from grid import LocalGrid

    def build(overrides: str, num_nodes: int, client_app=None, **kwargs):
        if client_app is None:
            from client.app import app as client_app
        return LocalGrid(client_app, num_nodes=num_nodes, run_config={"overrides": overrides}, **kwargs)

    return build


@pytest.fixture
def run_inprocess(local_grid, tmp_path):
    """``run_inprocess(overrides) -> (results payload, grid)``: a whole run of the real ServerApp logic
    (discovery, strategy, central evaluation, results files) over a ``LocalGrid``, without Ray.
    ``ground_truth=true`` as in a simulation unless the overrides set it; out_dir under tmp_path: the
    first run's tmp_path/run, each later one a folder of its own (a folder holds one run's results)."""
    from server.config import load_run
    from server.run import run_server
    from settings.compose import compose_config

    calls = 0

    def run(overrides: str, **grid_options):
        nonlocal calls
        calls += 1
        words = overrides.split()
        if not any(word.startswith("ground_truth=") for word in words):
            words.append("ground_truth=true")
        if not any(word.startswith("out_dir=") for word in words):
            words.append(f"out_dir={tmp_path / ('run' if calls == 1 else f'run-{calls}')}")
        plan = load_run(compose_config(words))
        grid = local_grid(" ".join(words), plan.settings.num_clients, **grid_options)
        return run_server(grid, plan), grid

    return run
