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
    """What the scene knows about its labels.

    noisy_clients: clients the noise model made noisy (level > 0; under CIFAR-N's human labels, the
        clients that took them and whose labels changed).
    true_noise: each client's share of wrong labels at the start, over its samples with a known true
        label (NaN for a client with none); sizes: local set sizes; known: per client, how many of
        its samples have a known true label.
    real_noise: the labels the dataset ships are noisy themselves (Clothing1M): some true labels are
        unknown, or a client the noise model left clean has wrong labels. Then no client
        is noisy "by construction", and there is no ground truth of noisy clients to score detection.
    """

    noisy_clients: frozenset[int]
    true_noise: dict[int, float]
    sizes: dict[int, int]
    known: dict[int, int]
    real_noise: bool = False

    @classmethod
    def from_scene(cls, scene: Scene) -> GroundTruth:
        """The scene's noisy clients, true noise rates, local set sizes and whether its noise is real."""
        rates = scene.true_noise_rate()
        sizes = scene.client_sizes()
        known = scene.true_labels >= 0
        known_counts = np.bincount(scene.client, weights=known, minlength=scene.num_clients)
        untouched = scene.noise_level[scene.client] == 0
        wrong = known & (scene.noisy_labels != scene.true_labels)
        return cls(
            noisy_clients=frozenset(int(k) for k in np.flatnonzero(scene.noise_level > 0)),
            true_noise={k: float(rates[k]) for k in range(scene.num_clients)},
            sizes={k: int(sizes[k]) for k in range(scene.num_clients)},
            known={k: int(known_counts[k]) for k in range(scene.num_clients)},
            real_noise=bool((~known).any() or (wrong & untouched).any()),
        )

    def label_subset(self) -> str:
        """On which samples the label-noise figures are measured."""
        total, known = sum(self.sizes.values()), sum(self.known.values())
        if known == total:
            return f"all {total} samples"
        return f"the {known} of {total} samples with a known true label (a clean annotation)"
