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
