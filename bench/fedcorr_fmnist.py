"""FedCorr vs FedAvg on noisy Fashion-MNIST (100 clients, IID, LeNet-5), at equal communication cost
and each run to its plateau.

    .venv/bin/python bench/fedcorr_fmnist.py [--settings 0.0,0.0 0.6,0.5 0.8,0.5] [--plateau-cap 150]
                                             [--reuse] [-- Hydra overrides for every run ...]

For every (rho, tau) it runs FedCorr with conf/strategy/fedcorr.yaml and FedAvg with the same
communication cost (client participations). With --plateau-cap R > 0 it also runs FedAvg for R rounds
and FedCorr with R stage-3 rounds, and finds each one's plateau: the first round at which test
accuracy moved less than 0.3 points over the previous 20 rounds (FedCorr: over its stage-3 rounds).
FedCorr's sequential stage 1 does far more SGD per participation than FedAvg, so an equal-budget
FedAvg can trail even on clean labels; the plateau runs tell how much. --reuse skips every run whose
results.json under outputs/bench-fedcorr/ finished with the same config, so the benchmark resumes
where it was stopped. Prints one table.
"""

from __future__ import annotations

import argparse
from typing import Any

from runs import ConfigError, accuracies, check_all, main_with_clear_errors, plateau, run


def parse_setting(setting: str) -> tuple[str, str]:
    """(rho, tau) of a ``--settings`` entry such as ``0.6,0.5``."""
    rho, sep, tau = setting.partition(",")
    if not sep:
        raise ConfigError(f"--settings {setting!r} is invalid: allowed is rho,tau such as 0.6,0.5 "
                          "(Hydra overrides go before the options or after --)")
    return rho, tau


def plateau_cell(payload: dict[str, Any] | None, stage: str | None) -> str:
    """A plateau run's table cell: best accuracy (%) and the plateau's round, or "-" without the run."""
    if payload is None:
        return "-"
    at, _ = plateau(accuracies(payload, stage))
    best = 100 * max(accuracies(payload, stage))
    return f"{best:.2f} @{at}" if at is not None else f"{best:.2f} (none)"


def main() -> None:
    """Run (or reuse) every setting's FedCorr, equal-cost FedAvg and plateau runs, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["0.0,0.0", "0.6,0.5", "0.8,0.5"])
    parser.add_argument("--plateau-cap", type=int, default=0,
                        help="FedAvg rounds / FedCorr stage-3 rounds of the plateau runs (0: skip them)")
    parser.add_argument("--reuse", action="store_true", help="reuse finished runs with the same config")
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    base = ["experiment=fmnist", *args.overrides]
    settings = [parse_setting(setting) for setting in args.settings]
    scenes = {f"({rho}, {tau})": ([*base, "noise=fedcorr", f"noise.rho={rho}", f"noise.tau={tau}"],
                                  f"outputs/bench-fedcorr/rho{rho}-tau{tau}") for rho, tau in settings}
    plateau_runs = {}
    if args.plateau_cap:
        plateau_runs = {"fedavg-plateau": ["strategy=fedavg", f"strategy.num_rounds={args.plateau_cap}"],
                        "fedcorr-plateau": ["strategy=fedcorr", f"strategy.t3={args.plateau_cap}"]}
    # FedAvg's equal-cost run is planned after FedCorr's cost is known, so it is checked when it starts.
    check_all([[*scene, *choice, f"out_dir={tag}/{name}"] for scene, tag in scenes.values()
               for name, choice in {"fedcorr": ["strategy=fedcorr"], **plateau_runs}.items()], args.reuse)
    rows = []
    for setting, (scene, tag) in scenes.items():
        fedcorr = run([*scene, "strategy=fedcorr", f"out_dir={tag}/fedcorr"], args.reuse)
        cost, clients = fedcorr["summary"]["comm_cost"], fedcorr["config"]["num_clients"]
        per_round = max(1, round(fedcorr["config"]["strategy"]["frac2"] * clients))
        fedavg = run([*scene, "strategy=fedavg", f"strategy.fraction={per_round / clients}",
                      f"strategy.num_rounds={cost // per_round}", f"out_dir={tag}/fedavg"], args.reuse)
        row = {"setting": setting, "fedcorr": fedcorr, "fedavg": fedavg, "fedcorr_plateau": None,
               "fedavg_plateau": None}
        for name, choice in plateau_runs.items():
            row[name.replace("-", "_")] = run([*scene, *choice, f"out_dir={tag}/{name}"], args.reuse)
        rows.append(row)

    strategy = rows[0]["fedcorr"]["config"]["strategy"]
    print(f"\nFashion-MNIST, 100 clients IID, LeNet-5; FedCorr {strategy['t1']}/{strategy['t2']}/{strategy['t3']} "
          f"(T1/T2/T3); FedAvg at the same communication cost; plateau runs: best % @ plateau round")
    print(f"{'(rho, tau)':<11} {'comm':>5} {'FedCorr best/final':>19} {'FedAvg best/final':>18} "
          f"{'FedCorr plateau':>16} {'FedAvg plateau':>15} {'det. F1':>7} {'noise before -> after':>22}")
    for row in rows:
        fc, fa = row["fedcorr"], row["fedavg"]
        block = fc["fedcorr"]
        noise = block["label_noise"]
        print(f"{row['setting']:<11} {fc['summary']['comm_cost']:>5} "
              f"{100 * fc['summary']['best_acc']:>8.2f}/{100 * fc['summary']['final_acc']:<8.2f} "
              f"{100 * fa['summary']['best_acc']:>8.2f}/{100 * fa['summary']['final_acc']:<8.2f} "
              f"{plateau_cell(row['fedcorr_plateau'], 'usual'):>16} {plateau_cell(row['fedavg_plateau'], None):>15} "
              f"{block['detection']['f1']:>7.3f} {noise['before']:>9.4f} -> {noise['after_stage2']:<9.4f}")


if __name__ == "__main__":
    main_with_clear_errors(main)
