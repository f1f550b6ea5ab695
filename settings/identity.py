"""Which settings make two runs different runs, and how two configs differ.

A run is what it computes: its scene (dataset, partition, noise, client count, seed) and every other
setting except those that only say how it executes or where it writes (``NOT_IDENTITY``). The default
``out_dir`` names the scene in its path and the rest by ``digest``, so two runs of one scene that
differ in a method's option, the model or the schedule write to different folders; and a run refuses a
folder that holds another run's results (``server.config``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

EXECUTION_KEYS = frozenset({"resume", "replace", "logging", "simulation.verbose", "simulation.ray_init_args",
                            "simulation.ray_address",
                            "server.round_timeout", "server.node_wait_timeout"})
"""Keys that change how a run executes, not what it computes: a resumed run may change them."""
NOT_IDENTITY = EXECUTION_KEYS | frozenset({
    "out_dir", "ground_truth", "scene", "export", "simulation", "server.device", "client.device",
    "server.checkpoint_every", "server.keep_checkpoints", "dataset.root", "dataset.download", "dataset.cache_dir",
    "extend_from",
})
"""Keys two runs may differ in and still be the same run: where it writes and checkpoints, where its
data is read from, what runs it (devices, Ray), what it logs, whether the server may read the
ground truth (which adds diagnostics to the results, not a different computation), and the shorter run
of its config it continues from (``extend_from``: the same results as from round 0)."""
SCENE_KEYS = frozenset({"dataset.name", "dataset.num_classes", "partition", "noise", "num_clients", "seed"})
"""The keys the default out_dir spells out in its path (the scene); the digest covers the rest."""
AS_BEFORE: dict[str, Any] = {
    "participation": {"late": 0.0, "join_round": 2},
    "strategy.stage2_rows": "all",
    "strategy.stage2_keep": None,
    "strategy.client_score": "cumulative",
    "strategy.client_components": "two",
    "strategy.joiners": "as_clean",
    "strategy.balanced_split": False,
    "extend_from": None,
}
"""Options added after runs were stored, each with the value at which a run computes what a run of the
code before it computed. A stored config without such a key and one with it at that value do not
differ: a finished or killed run of older code is still the same run (bench reuse, resume)."""


def digest(config: dict[str, Any]) -> str:
    """Eight hex digits that differ whenever two resolved configs differ outside ``NOT_IDENTITY`` and
    ``SCENE_KEYS``: the method, its options, the model, the schedule, the budget, the transforms. A key
    of ``AS_BEFORE`` at its value is left out, as ``changed_keys`` leaves it out: adding an option keeps
    the default folders of the runs that were made before it."""
    kept = _without(config, NOT_IDENTITY | SCENE_KEYS)
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def run_differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``config_changes`` between two runs' configs outside ``NOT_IDENTITY``: empty for the same run."""
    return config_changes(before, after, NOT_IDENTITY)


def _without(values: dict[str, Any], ignore: frozenset[str], prefix: str = "") -> dict[str, Any]:
    """``values`` without the keys of ``ignore`` and the ``AS_BEFORE`` keys at their as-before values."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if path in ignore or (path in AS_BEFORE and AS_BEFORE[path] == value):
            continue
        kept[key] = _without(value, ignore, f"{path}.") if isinstance(value, dict) else value
    return kept


def changed_keys(before: dict[str, Any], after: dict[str, Any], ignore: frozenset[str] = frozenset(),
                 prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested configs (added or removed ones too, but a
    key of ``AS_BEFORE`` missing on one side and at its value on the other), leaving out ``ignore`` and
    everything below it."""
    keys = []
    for key in sorted(set(before) | set(after), key=str):
        path = f"{prefix}{key}"
        if any(path == skip or path.startswith(f"{skip}.") for skip in ignore):
            continue
        old, new = before.get(key, _UNSET), after.get(key, _UNSET)
        if isinstance(old, dict) and isinstance(new, dict):
            keys += changed_keys(old, new, ignore, f"{path}.")
        elif old != new and not _as_before(path, old, new):
            keys.append(path)
    return keys


def config_changes(before: dict[str, Any], after: dict[str, Any], ignore: frozenset[str] = frozenset(),
                   ) -> list[str]:
    """``changed_keys`` as ``key (old -> new)``."""
    return [f"{key} ({_at(before, key)} -> {_at(after, key)})" for key in changed_keys(before, after, ignore)]


_UNSET = "<unset>"


def _as_before(path: str, old: Any, new: Any) -> bool:
    """Whether one side lacks the option ``path`` of ``AS_BEFORE`` and the other has it at its value."""
    return path in AS_BEFORE and _UNSET in (old, new) and AS_BEFORE[path] in (old, new)


def _at(values: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(values, dict) or part not in values:
            return _UNSET
        values = values[part]
    return values
