"""A Table 6 analogue on Fashion-MNIST: FedCorr in full and with each component removed alone.

    .venv/bin/python bench/fedcorr_ablation.py [--setting 0.6,0.5] [--seeds 1] [--rows NAME ...] [--reuse]
                                               [-- Hydra overrides for every run ...]

100 IID clients, LeNet-5, conf/strategy/fedcorr.yaml; one row per Table 6 switch
(``strategy.ablation.<switch>=false``): no correction, no fraction scheduling, no local proximal
term, no finetuning, no usual training, no mixup. Prints, per row, best / final test accuracy, the
communication cost, detection F1 and label noise after stage 2 (mean ± sample std over the seeds),
beside the paper's CIFAR-10 best accuracy for the same row and (rho, tau) (Table 6, 5 trials) for
orientation: a different dataset, model and schedule, so compare the ordering of the rows, not the
numbers. The full run shares its folder with bench/fedcorr_fmnist.py's FedCorr run, so --reuse
takes it from there. Runs: outputs/bench-fedcorr/rho<rho>-tau<tau>/seed<seed>/<row>/.
"""

from __future__ import annotations

import argparse

from fedcorr_fmnist import parse_setting
from runs import (
    ConfigError,
    add_launch_arguments,
    check_all,
    fedcorr_figure,
    launcher_from,
    main_with_clear_errors,
    run_plan,
    spread,
)

SWITCHES = ("correction", "fraction_scheduling", "local_proximal", "finetuning", "usual_training", "mixup")
ROWS = ("fedcorr", *(f"no-{switch.replace('_', '-')}" for switch in SWITCHES))
# FedCorr Table 6 (CIFAR-10, IID, ResNet-18): best test accuracy, mean ± std over 5 trials, per row.
PAPER_TABLE_6 = {
    ("0.0", "0.0"): ("93.82±0.41", "92.85±0.66", "86.05±1.47", "93.37±0.05", "92.71±0.18", "93.11±0.10", "90.63±0.70"),
    ("0.4", "0.0"): ("94.01±0.22", "93.71±0.20", "85.59±1.10", "93.64±0.15", "93.06±0.15", "93.53±0.17", "88.83±1.88"),
    ("0.4", "0.5"): ("94.15±0.18", "93.60±0.21", "78.44±7.90", "93.46±0.17", "92.62±0.28", "93.46±0.14", "91.34±0.39"),
    ("0.6", "0.0"): ("92.93±0.25", "92.15±0.29", "80.29±2.62", "92.34±0.14", "91.41±0.14", "92.16±0.24", "87.79±0.89"),
    ("0.6", "0.5"): ("92.50±0.28", "91.77±0.65", "77.96±3.65", "91.74±0.47", "89.31±0.90", "91.50±0.51", "87.50±1.33"),
    ("0.8", "0.0"): ("91.52±0.50", "90.48±0.56", "76.67±3.48", "90.45±0.94", "89.62±0.40", "90.62±0.59", "87.86±0.53"),
    ("0.8", "0.5"): ("90.59±0.70", "88.77±1.10", "72.71±5.03", "88.74±1.72", "83.81±2.59", "88.97±1.37", "83.29±1.78"),
}


def row_overrides(row: str) -> list[str]:
    """The strategy overrides of a row: the full method, or one Table 6 switch off."""
    if row == "fedcorr":
        return ["strategy=fedcorr"]
    return ["strategy=fedcorr", f"strategy.ablation.{row.removeprefix('no-').replace('-', '_')}=false"]


def main() -> None:
    """Run (or reuse) every row's runs and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", default="0.6,0.5", help="rho,tau of the scene")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS), metavar="ROW",
                        help=f"the rows to run, of {', '.join(ROWS)} (default: all)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse finished runs with the same config, resume stopped ones from their checkpoint")
    add_launch_arguments(parser)
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    launcher = launcher_from(args)
    rho, tau = parse_setting(args.setting, "--setting")
    if len(set(args.seeds)) != len(args.seeds):
        raise ConfigError(f"--seeds {' '.join(map(str, args.seeds))} is invalid: allowed are distinct seeds")

    def overrides(row: str, seed: int) -> list[str]:
        out_dir = f"outputs/bench-fedcorr/rho{rho}-tau{tau}/seed{seed}/{row}"
        return ["experiment=fmnist", *args.overrides, f"seed={seed}", "noise=fedcorr", f"noise.rho={rho}",
                f"noise.tau={tau}", *row_overrides(row), f"out_dir={out_dir}"]

    plan = {(row, seed): overrides(row, seed) for row in args.rows for seed in args.seeds}
    check_all(list(plan.values()), args.reuse)
    done = run_plan(plan, list(plan), args.reuse, launcher=launcher)
    table = {row: [done[(row, seed)] for seed in args.seeds] for row in args.rows}
    paper = PAPER_TABLE_6.get((rho, tau))
    print(f"\nTable 6 analogue: Fashion-MNIST, 100 clients IID, LeNet-5, (rho, tau) = ({rho}, {tau}), seeds "
          f"{' '.join(map(str, args.seeds))}; paper: CIFAR-10 best accuracy (Table 6, 5 trials)")
    print(f"{'row':<24} {'best %':>12} {'final %':>12} {'comm':>5} {'det. F1':>12} {'noise s2 %':>12} "
          f"{'paper best %':>13}")
    for row, payloads in table.items():
        f1 = [fedcorr_figure(p, lambda b: (b["detection"] or {}).get("f1")) for p in payloads]
        noise = [fedcorr_figure(p, lambda b: b["label_noise"].get("after_stage2")) for p in payloads]
        print(f"{row:<24} {spread([p['summary']['best_acc'] for p in payloads], 100):>12} "
              f"{spread([p['summary']['final_acc'] for p in payloads], 100):>12} "
              f"{'/'.join(sorted({str(p['summary']['comm_cost']) for p in payloads})):>5} "
              f"{spread(f1, 1, 3):>12} {spread(noise, 100):>12} {paper[ROWS.index(row)] if paper else '-':>13}")


if __name__ == "__main__":
    main_with_clear_errors(main)
