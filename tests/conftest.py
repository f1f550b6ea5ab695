"""Shared fixtures: an isolated dataset cache and small real datasets."""

from __future__ import annotations

import os

import pytest

# Flower reports usage to its servers by default; tests must not try to phone home.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


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


@pytest.fixture
def node_context():
    """A simulated node's context: ``node_context(overrides, partition_id)``."""
    from flwr.app import Context, RecordDict

    def build(overrides: str, partition_id: int):
        return Context(run_id=1, node_id=77, node_config={"partition-id": partition_id}, state=RecordDict(),
                       run_config={"overrides": overrides})

    return build


@pytest.fixture(scope="session")
def prepared_run(tmp_path_factory: pytest.TempPathFactory):
    """``prepared_run(overrides)``: the scene for ``overrides`` prepared under a fresh out_dir, as the
    handlers see it: (overrides with that out_dir, the scene, the initial global arrays)."""
    from conf import compose_config
    from data.scene import prepare_scene
    from server.run import initial_arrays

    def prepare(overrides: str):
        overrides = f"{overrides} out_dir={tmp_path_factory.mktemp('run')}"
        cfg = compose_config(overrides.split())
        scene, dataset, _ = prepare_scene(cfg)
        return overrides, scene, initial_arrays(cfg, dataset)

    return prepare
