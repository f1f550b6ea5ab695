"""Independent random streams derived from the one configured seed.

Each consumer (partition, noise, training, ...) gets its own named stream, so changing the noise
settings never changes the partition drawn with the same seed.
"""

from __future__ import annotations

import zlib

import numpy as np


def rng_for(seed: int, stream: str) -> np.random.Generator:
    """A generator for ``stream`` that depends only on ``seed`` and the stream's name."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(stream.encode())]))
