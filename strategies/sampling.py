"""Seeded client sampling and round sizes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.errors import ConfigError


def round_size(fraction: float, population: int, minimum: int = 1) -> int:
    """Clients per round: max(minimum, round(fraction * population)), at most the population."""
    return min(population, max(minimum, int(round(fraction * population))))


def sample_clients(rng: np.random.Generator, population: Sequence[int], count: int) -> list[int]:
    """``count`` distinct clients drawn uniformly from ``population`` (sorted, for readable logs)."""
    if count > len(population):
        raise ConfigError(f"cannot sample {count} clients from {len(population)}")
    return sorted(int(pid) for pid in rng.choice(np.asarray(population), size=count, replace=False))
