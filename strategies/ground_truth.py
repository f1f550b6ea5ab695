"""The simulated scene's ground truth as a strategy sees it: which clients are noisy, and how noisy.

Only a run that says it has ground truth (``ground_truth=true``; ``sim.py`` sets it) builds one; a
deployed server has none, and then reports no figure that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.scene import Scene


@dataclass(frozen=True)
class GroundTruth:
    """noisy_clients: clients the noise model made noisy (level > 0).
    true_noise: each client's share of wrong labels at the start; sizes: local set sizes."""

    noisy_clients: frozenset[int]
    true_noise: dict[int, float]
    sizes: dict[int, int]

    @classmethod
    def from_scene(cls, scene: Scene) -> GroundTruth:
        """The scene's noisy clients, true noise rates and local set sizes."""
        rates = scene.true_noise_rate()
        sizes = scene.client_sizes()
        return cls(
            noisy_clients=frozenset(int(k) for k in np.flatnonzero(scene.noise_level > 0)),
            true_noise={k: float(rates[k]) for k in range(scene.num_clients)},
            sizes={k: int(sizes[k]) for k in range(scene.num_clients)},
        )
