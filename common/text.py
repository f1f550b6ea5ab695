"""Words for what a person reads: counts with the noun in the right number."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 client``, ``3 clients``, ``0 clients``; ``plural`` where adding an s is wrong
    (``counted(2, "warm-up round")`` is ``2 warm-up rounds``, ``counted(2, "re-detection", "re-detections")``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
