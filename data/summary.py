"""Human-readable summary of a scene: one row per client plus totals."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from common.text import counted

if TYPE_CHECKING:
    from data.scene import Scene


def per_client_classes(scene: Scene) -> np.ndarray:
    """Number of distinct classes each client holds (by true label where known, else the shipped one)."""
    reference = scene.reference_labels()
    num_classes = int(reference.max()) + 1 if reference.size else 0
    present = np.zeros((scene.num_clients, num_classes), dtype=bool)
    present[scene.client, reference] = True
    return present.sum(axis=1)


def format_summary(scene: Scene) -> str:
    """A table of n, classes, requested noise level and realised noise per client (and its kind of noise
    where the model deals several), then totals."""
    sizes = scene.client_sizes()
    classes = per_client_classes(scene)
    noise = scene.true_noise_rate()
    kinds = scene.noise_kind
    width = max((len(kind) for kind in kinds), default=0)
    header = f"{'client':>6} {'n':>7} {'classes':>7} {'level':>6} {'true_noise':>10}"
    lines = [f"{header}  kind" if kinds else header]
    for k in range(scene.num_clients):
        row = f"{k:>6} {sizes[k]:>7} {classes[k]:>7} {scene.noise_level[k]:>6.3f} {noise[k]:>10.3f}"
        lines.append(f"{row}  {kinds[k] or '-':<{width}}".rstrip() if kinds else row)
    known = scene.true_labels >= 0
    overall = float(np.mean(scene.noisy_labels[known] != scene.true_labels[known])) if known.any() else float("nan")
    spec = scene.spec
    lines += [
        "",
        f"dataset {spec['dataset']['name']}: {scene.indices.size} training samples over "
        f"{counted(scene.num_clients, 'client')} (n min {sizes.min()}, mean {sizes.mean():.1f}, max {sizes.max()})",
        f"partition {spec['partition']}, noise {spec['noise']}, seed {spec['seed']}",
        f"noisy clients (true noise > 0): {int(np.sum(noise > 0))}/{scene.num_clients}; "
        f"label noise over all samples: {overall:.4f}",
    ]
    if kinds:
        dealt = Counter(kind for kind in kinds if kind)
        lines.append("noisy clients by kind: " + ", ".join(f"{kind} {count}" for kind, count in sorted(dealt.items())))
    return "\n".join(lines)
