"""What the accuracy benchmarks share: running one configured simulation (or reusing its finished
results), and finding where a run's test accuracy plateaus."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import DictConfig, OmegaConf  # noqa: E402

import sim  # noqa: E402
from common.errors import ConfigError  # noqa: E402
from reports.tables import mean_std  # noqa: E402
from server.config import load_run  # noqa: E402
from settings.compose import compose_config  # noqa: E402

PLATEAU_WINDOW = 20
PLATEAU_POINTS = 0.003


def finished_results(out_dir: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The results in ``out_dir`` if that run completed with exactly ``config``; else None.

    A completed run there with a different config is an error rather than a rerun: rerunning would
    overwrite hours of finished work because, say, a default changed since. The message names the
    differing keys so the user can decide (remove the folder, or run without --reuse)."""
    path = Path(out_dir) / "results.json"
    if not path.is_file():
        return None
    payload = json.loads(path.read_text())
    if not payload.get("complete"):
        return None
    if payload.get("config") != config:
        changed = ", ".join(differing_keys(payload.get("config") or {}, config)[:8])
        raise ConfigError(f"{path} holds a finished run with another config (differs in: {changed}); "
                          f"--reuse will not overwrite it: remove {out_dir} to rerun it, or run without --reuse")
    return payload


def differing_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of the keys whose values differ between two nested configs (added or removed too)."""
    keys = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differing_keys(a, b, f"{prefix}{key}.")
        elif key not in old or key not in new or a != b:
            keys.append(f"{prefix}{key}")
    return keys


def planned(overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """The config of a planned simulation and its overrides, as ``sim.run`` will run them."""
    return sim.with_ground_truth(compose_config(overrides), overrides)


def finished(overrides: list[str]) -> dict[str, Any] | None:
    """The results of this planned run if it finished with the same config; runs nothing."""
    return finished_run(planned(overrides)[0])


def finished_run(cfg: DictConfig) -> dict[str, Any] | None:
    """``finished_results`` for a composed config: its out_dir, its resolved values."""
    return finished_results(cfg.out_dir, OmegaConf.to_container(cfg, resolve=True))


def run(overrides: list[str], reuse: bool = False) -> dict[str, Any]:
    """One simulation with these Hydra overrides. ``reuse``: return a finished run with the same
    resolved config instead of running it again (so a long benchmark can be stopped and resumed)."""
    cfg, overrides = planned(overrides)
    if reuse:
        done = finished_run(cfg)
        if done is not None:
            print(f"reusing {cfg.out_dir}/results.json", flush=True)
            return done
    return sim.run(cfg, overrides)


def main_with_clear_errors(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``; bad input is one line on stderr and exit status 2."""
    try:
        main()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def check_all(runs: list[list[str]], reuse: bool = False) -> None:
    """Compose and check every planned run before the first starts: a typo, or (with ``reuse``) a
    finished run whose config changed, fails in seconds, not hours."""
    for overrides in runs:
        cfg, _ = planned(overrides)
        load_run(cfg)
        if reuse:
            finished_run(cfg)


def plateau(accuracies: list[float]) -> tuple[int | None, float | None]:
    """(position, mean accuracy of the window) where test accuracy first moved less than 0.3 points
    over 20 consecutive evaluations; (None, None) if it never did."""
    for end in range(PLATEAU_WINDOW, len(accuracies) + 1):
        window = accuracies[end - PLATEAU_WINDOW:end]
        if max(window) - min(window) < PLATEAU_POINTS:
            return end, sum(window) / len(window)
    return None, None


def accuracies(payload: dict[str, Any], stage: str | None = None) -> list[float]:
    """The evaluated test accuracies of a run, optionally of one stage only."""
    return [r["test_acc"] for r in payload["rounds"]
            if r["test_acc"] is not None and (stage is None or r["stage"] == stage)]


def spread(values: list[float | None], scale: float = 1.0, digits: int = 2) -> str:
    """Mean ± sample std of the known values, compact for fixed-width tables (see ``mean_std``)."""
    return mean_std(values, scale, digits, separator="±")


def fedcorr_figure(run_payload: dict[str, Any], pick: Callable[[dict[str, Any]], float | None]) -> float | None:
    """A figure of a run's ``fedcorr`` block (None for a run without one, or without the figure)."""
    block = run_payload.get("fedcorr")
    return pick(block) if block else None
