"""Counts a person reads say "1 client" and "2 clients", never "1 clients"."""

from __future__ import annotations

import pytest

from common.text import counted


@pytest.mark.parametrize(("count", "expected"), [(0, "0 clients"), (1, "1 client"), (2, "2 clients")])
def test_counted_uses_the_singular_for_one_only(count: int, expected: str) -> None:
    assert counted(count, "client") == expected


def test_counted_takes_an_irregular_plural() -> None:
    assert counted(1, "warm-up round") == "1 warm-up round"
    assert counted(3, "analysis", "analyses") == "3 analyses"
    assert counted(1, "analysis", "analyses") == "1 analysis"
