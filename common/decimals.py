"""Rates and shares as the decimals they are written as, so floor and equality are exact."""

from __future__ import annotations

from fractions import Fraction


def as_written(value: float) -> Fraction:
    """``value`` as the decimal its shortest repr spells: 0.8 is 4/5, though the binary float is not,
    so (1 - 0.8) * 10 is exactly 2 and 0.3 + 0.7 exactly 1."""
    return Fraction(str(float(value)))
