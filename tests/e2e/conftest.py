"""The end-to-end tier: every test in this folder starts Ray, a subprocess or a deployment, and is
marked ``e2e`` here (the fast tier is ``-m "not e2e"``)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of this folder ``e2e``."""
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)
