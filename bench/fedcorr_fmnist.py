"""FedCorr vs FedAvg on noisy Fashion-MNIST (100 clients, IID, LeNet-5), at equal communication cost,
over seeds, with FedCorr variants beside them, and optionally each run to its plateau.

    .venv/bin/python bench/fedcorr_fmnist.py [--settings 0.0,0.0 0.6,0.5 0.8,0.5] [--seeds 1 2 3]
                                             [--variant NAME OVERRIDE ...] [--variant-seeds 1]
                                             [--plateau-cap 150] [--reuse] [-- Hydra overrides ...]

For every (rho, tau) and seed it runs FedCorr with conf/strategy/fedcorr.yaml and FedAvg with the same
communication cost (client participations); the seed sets the scene (partition, noise) and training.
``--variant global-split strategy.split_losses=global`` adds a FedCorr column with those overrides,
run for the ``--variant-seeds`` (default: the first seed); repeat --variant for more columns. With
--plateau-cap R > 0 it also runs FedAvg for R rounds and FedCorr with R stage-3 rounds, and finds each
one's plateau: the first round at which test accuracy moved less than 0.3 points over the previous 20
rounds (FedCorr: over its stage-3 rounds). --reuse skips every run whose results.json under
outputs/bench-fedcorr/ finished with the same config and continues a run stopped mid-run from its latest
checkpoint, so the benchmark resumes where it was stopped.
Prints one table: per setting and column, mean ± std over its seeds (sample std; one seed: the value).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from runs import (
    ConfigError,
    accuracies,
    add_launch_arguments,
    check_all,
    fedcorr_figure,
    launcher_from,
    main_with_clear_errors,
    plateau,
    run_plan,
    spread,
)

PLATEAU_RUNS = ("fedavg-plateau", "fedcorr-plateau")


def parse_setting(setting: str, option: str = "--settings") -> tuple[str, str]:
    """(rho, tau) of a ``--settings`` entry such as ``0.6,0.5``."""
    rho, sep, tau = setting.partition(",")
    if not sep:
        raise ConfigError(f"{option} {setting!r} is invalid: allowed is rho,tau such as 0.6,0.5 "
                          "(Hydra overrides go before the options or after --)")
    return rho, tau


def parse_variants(variants: list[list[str]]) -> dict[str, list[str]]:
    """``--variant NAME OVERRIDE ...`` entries as {name: overrides}; names must be new and folder-safe."""
    parsed: dict[str, list[str]] = {}
    for name, *overrides in variants:
        if not name.replace("-", "").replace("_", "").isalnum() or name in ("fedcorr", "fedavg", *PLATEAU_RUNS):
            raise ConfigError(f"--variant {name}={' '.join(overrides)} is invalid: allowed is a new column name "
                              "of letters, digits, - and _, then Hydra overrides")
        if not overrides or name in parsed:
            raise ConfigError(f"--variant {name} is invalid: allowed is a name used once, then at least one override")
        parsed[name] = overrides
    return parsed


def plateau_cell(payload: dict[str, Any] | None, stage: str | None) -> str:
    """A plateau run's table cell: best accuracy (%) and the plateau's round, or "-" without the run."""
    if payload is None:
        return "-"
    at, _ = plateau(accuracies(payload, stage))
    best = 100 * max(accuracies(payload, stage))
    return f"{best:.2f} @{at}" if at is not None else f"{best:.2f} (none)"


COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], float | None], float, int]] = {
    # header: (what, scale, digits)
    "best %": ("best", lambda p: p["summary"]["best_acc"], 100, 2),
    "final %": ("final", lambda p: p["summary"]["final_acc"], 100, 2),
    "last10 %": ("last10", lambda p: p["summary"]["last10_mean_acc"], 100, 2),
    "det. F1": ("f1", lambda p: fedcorr_figure(p, lambda b: (b["detection"] or {}).get("f1")), 1, 3),
    "noise s1 %": ("s1", lambda p: fedcorr_figure(p, lambda b: b["label_noise"].get("after_stage1")), 100, 2),
    "noise s2 %": ("s2", lambda p: fedcorr_figure(p, lambda b: b["label_noise"].get("after_stage2")), 100, 2),
    "relabel prec.": ("prec", lambda p: fedcorr_figure(p, lambda b: b["relabel_precision"]), 1, 3),
    "mu_hat MAE": ("mae", lambda p: fedcorr_figure(p, lambda b: b.get("noise_estimate_mae")), 1, 3),
}


def remaining_noise(payload: dict[str, Any]) -> dict[str, float | None]:
    """Where a FedCorr run's wrong labels sit at its end (% of all known labels), and how good the model
    that made the stage-2 corrections was: wrong labels on the clients stage 2 finetuned on (S_c, never
    relabelled at the end of stage 2) and on the others, their relabel precision over the run, and the
    test accuracy of the global model at the end of stage 2."""
    rows = payload["fedcorr"]["clients"]
    known = sum(row["n_known"] for row in rows)
    wrong = {flag: sum(row["true_noise_after"] * row["n_known"] for row in rows
                       if row["finetuned"] == flag and row["n_known"]) for flag in (True, False)}
    finetune = [r["test_acc"] for r in payload["rounds"] if r["stage"] == "finetune" and r["test_acc"] is not None]
    return {"in S_c": 100 * wrong[True] / known, "outside S_c": 100 * wrong[False] / known,
            "clients outside S_c": float(sum(not row["finetuned"] for row in rows)),
            "acc end of stage 2": 100 * finetune[-1] if finetune else None}


def print_table(table: dict[str, dict[str, list[dict[str, Any]]]], seeds: dict[str, list[int]]) -> None:
    """One line per (setting, column): mean ± std over that column's seeds."""
    widths = {header: max(len(header), 13) for header in COLUMNS}
    print(f"{'(rho, tau)':<11} {'column':<16} {'seeds':<7} {'comm':>5} "
          + " ".join(f"{header:>{widths[header]}}" for header in COLUMNS))
    for setting, columns in table.items():
        for name, payloads in columns.items():
            comm = sorted({p["summary"]["comm_cost"] for p in payloads})
            cells = [f"{spread([pick(p) for p in payloads], scale, digits):>{widths[header]}}"
                     for header, (_, pick, scale, digits) in COLUMNS.items()]
            print(f"{setting:<11} {name:<16} {','.join(map(str, seeds[name])):<7} "
                  f"{'/'.join(map(str, comm)):>5} " + " ".join(cells))


def main() -> None:
    """Run (or reuse) every setting's and seed's runs, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["0.0,0.0", "0.6,0.5", "0.8,0.5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds of FedCorr and FedAvg")
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME_OR_OVERRIDE",
                        help="a FedCorr column: a name, then Hydra overrides (repeatable)")
    parser.add_argument("--variant-seeds", nargs="+", type=int, default=None,
                        help="seeds of the --variant columns (default: the first of --seeds)")
    parser.add_argument("--plateau-cap", type=int, default=0,
                        help="FedAvg rounds / FedCorr stage-3 rounds of the plateau runs (0: skip them)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse finished runs with the same config, resume stopped ones from their checkpoint")
    add_launch_arguments(parser)
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    variants = parse_variants(args.variant)
    variant_seeds = args.variant_seeds or args.seeds[:1]
    settings = [parse_setting(setting) for setting in args.settings]

    def scene(rho: str, tau: str, seed: int) -> tuple[list[str], str]:
        overrides = ["experiment=fmnist", *args.overrides, f"seed={seed}", "noise=fedcorr",
                     f"noise.rho={rho}", f"noise.tau={tau}"]
        return overrides, f"outputs/bench-fedcorr/rho{rho}-tau{tau}/seed{seed}"

    fedcorr_runs = {"fedcorr": (["strategy=fedcorr"], args.seeds)}
    fedcorr_runs |= {name: (["strategy=fedcorr", *overrides], variant_seeds) for name, overrides in variants.items()}
    if args.plateau_cap:
        fedcorr_runs |= {"fedavg-plateau": (["strategy=fedavg", f"strategy.num_rounds={args.plateau_cap}"], args.seeds),
                         "fedcorr-plateau": (["strategy=fedcorr", f"strategy.t3={args.plateau_cap}"], args.seeds)}
    # FedAvg's equal-cost run is planned after FedCorr's cost is known, so it is checked when it starts.
    check_all([[*scene(rho, tau, seed)[0], *choice, f"out_dir={scene(rho, tau, seed)[1]}/{name}"]
               for rho, tau in settings for name, (choice, seeds) in fedcorr_runs.items() for seed in seeds],
              args.reuse)
    seeds_of = {"fedcorr": args.seeds, "fedavg": args.seeds, **{name: s for name, (_, s) in fedcorr_runs.items()}}
    launcher = launcher_from(args)
    plan = {(rho, tau, seed, name): [*scene(rho, tau, seed)[0], *choice, f"out_dir={scene(rho, tau, seed)[1]}/{name}"]
            for rho, tau in settings for seed in sorted(set(args.seeds) | set(variant_seeds))
            for name, (choice, seeds) in fedcorr_runs.items() if seed in seeds}
    done = run_plan(plan, list(plan), args.reuse, launcher=launcher)

    def equal_cost(rho: str, tau: str, seed: int) -> list[str]:
        """FedAvg at the cost FedCorr spent, with FedCorr's stage-2/3 clients per round."""
        overrides, tag = scene(rho, tau, seed)
        fedcorr = done[(rho, tau, seed, "fedcorr")]
        cost, clients = fedcorr["summary"]["comm_cost"], fedcorr["config"]["num_clients"]
        per_round = max(1, round(fedcorr["config"]["strategy"]["frac2"] * clients))
        return [*overrides, "strategy=fedavg", f"strategy.fraction={per_round / clients}",
                f"strategy.num_rounds={cost // per_round}", f"out_dir={tag}/fedavg"]

    fedavg = {(rho, tau, seed, "fedavg"): equal_cost(rho, tau, seed) for rho, tau in settings for seed in args.seeds}
    check_all(list(fedavg.values()), args.reuse)
    done |= run_plan(fedavg, list(fedavg), args.reuse, launcher=launcher)
    table: dict[str, dict[str, list[dict[str, Any]]]] = {
        f"({rho}, {tau})": {name: [done[(rho, tau, seed, name)] for seed in sorted(seeds_of[name])]
                            for name in seeds_of}
        for rho, tau in settings}

    first = table[next(iter(table))]["fedcorr"][0]["config"]["strategy"]
    print(f"\nFashion-MNIST, 100 clients IID, LeNet-5; FedCorr {first['t1']}/{first['t2']}/{first['t3']} (T1/T2/T3); "
          "FedAvg at the same communication cost; mean ± sample std over the seeds listed")
    print_table(table, seeds_of)
    print("\nFedCorr: where the wrong labels sit after stage 2 (% of all known labels), mean ± std over seeds")
    parts = list(remaining_noise(table[next(iter(table))]["fedcorr"][0]))
    print(f"{'(rho, tau)':<11} " + " ".join(f"{part:>20}" for part in parts))
    for setting, columns in table.items():
        figures = [remaining_noise(payload) for payload in columns["fedcorr"]]
        print(f"{setting:<11} " + " ".join(f"{spread([f[part] for f in figures]):>20}" for part in parts))
    if args.plateau_cap:
        print("\nplateau runs (first seed): best % @ plateau round")
        for setting, columns in table.items():
            print(f"{setting:<11} FedCorr {plateau_cell(columns['fedcorr-plateau'][0], 'usual'):>16}  "
                  f"FedAvg {plateau_cell(columns['fedavg-plateau'][0], None):>15}")


if __name__ == "__main__":
    main_with_clear_errors(main)
