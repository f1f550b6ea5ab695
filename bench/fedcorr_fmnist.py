"""FedCorr vs FedAvg on noisy Fashion-MNIST (100 clients, IID, LeNet-5), at equal communication cost.

    .venv/bin/python bench/fedcorr_fmnist.py [--settings 0.0,0.0 0.6,0.5 0.8,0.5] [--plateau-cap 300]
                                             [Hydra overrides for both methods ...]

For every (rho, tau) it runs FedCorr with conf/strategy/fedcorr.yaml and FedAvg with the same
communication cost (client participations), and, with --plateau-cap R > 0, FedAvg once more for up
to R rounds to find its plateau: the first round at which test accuracy moved less than 0.3 points
over the previous 20 rounds. FedCorr's sequential stage 1 does far more SGD per participation than
FedAvg, so an equal-budget FedAvg can trail even on clean labels; the plateau run tells how much.
Prints one table; every run's results.json stays under outputs/bench-fedcorr/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sim  # noqa: E402
from conf import compose_config  # noqa: E402

PLATEAU_WINDOW = 20
PLATEAU_POINTS = 0.003


def plateau(accuracies: list[float]) -> tuple[int | None, float | None]:
    """(round, mean accuracy of the window) where accuracy first moved < 0.3 points over 20 rounds."""
    for end in range(PLATEAU_WINDOW, len(accuracies) + 1):
        window = accuracies[end - PLATEAU_WINDOW:end]
        if max(window) - min(window) < PLATEAU_POINTS:
            return end, sum(window) / len(window)
    return None, None


def run(overrides: list[str]) -> dict:
    return sim.run(compose_config(overrides), overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["0.0,0.0", "0.6,0.5", "0.8,0.5"])
    parser.add_argument("--plateau-cap", type=int, default=0, help="max FedAvg rounds for the plateau run (0: skip)")
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    base = ["experiment=fmnist", *args.overrides]
    rows = []
    for setting in args.settings:
        rho, tau = setting.split(",")
        scene = [*base, "noise=fedcorr", f"noise.rho={rho}", f"noise.tau={tau}"]
        tag = f"outputs/bench-fedcorr/rho{rho}-tau{tau}"
        fedcorr = run([*scene, "strategy=fedcorr", f"out_dir={tag}/fedcorr"])
        cost = fedcorr["summary"]["comm_cost"]
        per_round = max(1, round(fedcorr["config"]["strategy"]["frac2"] * fedcorr["config"]["num_clients"]))
        fedavg = run([*scene, "strategy=fedavg", f"strategy.fraction={per_round / fedcorr['config']['num_clients']}",
                      f"strategy.num_rounds={cost // per_round}", f"out_dir={tag}/fedavg"])
        row = {"setting": f"({rho}, {tau})", "fedcorr": fedcorr, "fedavg": fedavg, "plateau": (None, None)}
        if args.plateau_cap:
            long = run([*scene, "strategy=fedavg", f"strategy.num_rounds={args.plateau_cap}",
                        f"out_dir={tag}/fedavg-plateau"])
            row["plateau"] = plateau([r["test_acc"] for r in long["rounds"] if r["test_acc"] is not None])
        rows.append(row)

    print(f"\nFashion-MNIST, 100 clients IID, LeNet-5; FedCorr {fedcorr['config']['strategy']['t1']}/"
          f"{fedcorr['config']['strategy']['t2']}/{fedcorr['config']['strategy']['t3']} (T1/T2/T3); "
          f"FedAvg at the same communication cost")
    print(f"{'(rho, tau)':<11} {'comm':>5} {'FedCorr best/final':>19} {'FedAvg best/final':>18} "
          f"{'FedAvg plateau':>15} {'det. F1':>7} {'noise before -> after':>22}")
    for row in rows:
        fc, fa = row["fedcorr"], row["fedavg"]
        block = fc["fedcorr"]
        at, value = row["plateau"]
        plateau_text = "-" if at is None else f"{100 * value:.2f} @{at}"
        noise = block["label_noise"]
        print(f"{row['setting']:<11} {fc['summary']['comm_cost']:>5} "
              f"{100 * fc['summary']['best_acc']:>8.2f}/{100 * fc['summary']['final_acc']:<8.2f} "
              f"{100 * fa['summary']['best_acc']:>8.2f}/{100 * fa['summary']['final_acc']:<8.2f} "
              f"{plateau_text:>15} {block['detection']['f1']:>7.3f} "
              f"{noise['before']:>9.4f} -> {noise['after_stage2']:<9.4f}")


if __name__ == "__main__":
    main()
