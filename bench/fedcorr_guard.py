"""What the clean-case guards decide on the cumulative LID scores finished FedCorr runs recorded.

    .venv/bin/python bench/fedcorr_guard.py RUN_DIR [RUN_DIR ...]

For every stage-1 iteration of each run (its results.json), prints how many clients the unguarded
split flagged, Ashman's D of the 2-component fit, BIC(1 component) - BIC(2 components), and whether
each guard (``strategy.client_split_guard``: bic, separation) would have kept the split. The guard is a
pure function of the scores and the seed, and where it keeps the split it flags exactly the clients
the unguarded split flags: a run whose every iteration is kept is, by construction, the run the guard
would have produced. Where a guard declines, only a guarded run tells what follows
(bench/fedcorr_fmnist.py --variant NAME strategy.client_split_guard=GUARD).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from runs import ConfigError, main_with_clear_errors

from common.mixture import ashman_d, high_component  # noqa: E402  (runs puts the project root on the path)


def iteration_rows(results: Path) -> list[str]:
    """One printed line per stage-1 iteration of the run in ``results``."""
    payload = json.loads(results.read_text())
    block, seed = payload.get("fedcorr"), payload["config"]["seed"]
    if not block:
        raise ConfigError(f"RUN_DIR={results.parent} is invalid: allowed is the folder of a finished FedCorr run")
    from sklearn.mixture import GaussianMixture

    lines = []
    for record in block["iterations"]:
        scores = np.array([record["cumulative_lid"][k] for k in sorted(record["cumulative_lid"], key=int)])
        values = scores.reshape(-1, 1)
        two = GaussianMixture(n_components=2, random_state=seed).fit(values)
        one = GaussianMixture(n_components=1, random_state=seed).fit(values)
        kept = {guard: bool(high_component(scores, seed, guard).any()) for guard in ("bic", "separation")}
        lines.append(f"{str(results.parent):<58} {record['iteration']:>4} {len(record['detected_noisy_clients']):>8} "
                     f"{ashman_d(two.means_, two.covariances_):>9.2f} {one.bic(values) - two.bic(values):>10.1f} "
                     f"{'split' if kept['bic'] else 'declines':>9} {'split' if kept['separation'] else 'declines':>11}")
    return lines


def main() -> None:
    """Print the guards' decisions for every run directory given."""
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    print(f"{'run':<58} {'iter':>4} {'flagged':>8} {'Ashman D':>9} {'dBIC(1-2)':>10} {'bic':>9} {'separation':>11}")
    for folder in sys.argv[1:]:
        results = Path(folder) / "results.json"
        if not results.is_file():
            raise ConfigError(f"RUN_DIR={folder} is invalid: allowed is a folder holding a run's results.json")
        print("\n".join(iteration_rows(results)))


if __name__ == "__main__":
    main_with_clear_errors(main)
