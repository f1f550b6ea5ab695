"""FedCorr's stage-1 client split replayed on finished runs under other rules: which clients each rule
would flag as noisy from the scores the run's clients reported, and its detection F1.

    .venv/bin/python bench/client_split.py RUN_DIR [RUN_DIR ...]

A finished FedCorr run (``ground_truth=true``) keeps, per stage-1 iteration, each client's LID and
(with ``strategy.client_score=loss_share``) its loss share, in results.json, and the scene's truly noisy
clients. Every rule below splits those scores again as the server would, with the run's seed. The
run's own rule goes first and must flag exactly the clients the run flagged in every iteration, or the
script stops. Iteration 1 is replayed exactly: its scores do not depend on any split. A later
iteration's scores follow the run's own earlier splits (who was relabelled, with which proximal
weight), so a rule's figure there reads "with this run's history"; the last iteration decides who is
finetuned on, and its split (with the joiners' own iteration, as the run does it: the earlier split plus
the joiners it flags) is the one scored as final.

Rules (score, then split): the score is the cumulative, this iteration's or the mean LID, the loss share
(the client's share of samples in its high-loss component) of this iteration or its mean over the
client's iterations, or the disagreement (the share of its labels the iteration's global model predicts
otherwise; recorded only by runs with ``client_score=disagreement``); the split is the paper's two
components (the higher flagged), ``bic`` (1 to 3 components by BIC, all but the lowest flagged) or
``2-D`` (two components on this iteration's LID and loss share together, the one with the higher mean
loss share flagged).

With ``--from-checkpoint``, a run that did not record disagreements gets its last iteration's from its
stage-1-end checkpoint and stored labels (the same model and labels the strategy's query would read),
so the disagreement rules are scored at the last iteration, the one that decides the final split.

Prints per run the F1 (flagged count) of every rule at every iteration and at the end; with several
runs, then per rule the final F1's mean, its lowest and the runs under 0.95.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from finished_run import GlobalModel, label_version, last_round
from runs import ConfigError, main_with_clear_errors

from common.mixture import above_lowest, high_component
from strategies.detection import detection_scores

MIN_F1 = 0.95
# The share scores a run may record per iteration (strategy.client_score).
SHARES = ("loss_share", "disagreement")
Scores = dict[int, np.ndarray]  # client -> its score vector (one value, or LID and share for 2-D)


@dataclass(frozen=True)
class Iteration:
    """One stage-1 iteration as the run recorded it: the scores the split read, and who it flagged."""

    lid: dict[int, float]  # this iteration's LID of the clients that trained in it
    shares: dict[str, dict[int, float]]  # their share scores by name (SHARES), those the run asked for
    flagged: list[int]


@dataclass(frozen=True)
class Run:
    """A finished run's stage 1: its seed and rule, T1, the truly noisy clients and each iteration."""

    path: Path
    seed: int
    own_rule: str
    t1: int
    noisy: set[int]
    iterations: list[Iteration]


def load(run_dir: Path) -> Run:
    """The stage-1 record of a finished FedCorr run with ground truth; a clear error otherwise."""
    path = run_dir / "results.json"
    if not path.is_file():
        raise ConfigError(f"RUN_DIR={run_dir} is invalid: no results.json (a finished run's folder)")
    payload = json.loads(path.read_text())
    block, strategy = payload.get("fedcorr"), payload["config"]["strategy"]
    if not block or block.get("true_noisy_clients") is None:
        raise ConfigError(f"RUN_DIR={run_dir} is invalid: a FedCorr run with ground_truth=true")
    iterations = [Iteration({int(k): v for k, v in it["lid"].items()},
                            {name: {int(k): v for k, v in it[name].items()} for name in SHARES if it.get(name)},
                            sorted(it["detected_noisy_clients"])) for it in block["iterations"]]
    if strategy.get("client_split_guard", "none") != "none":
        raise ConfigError(f"RUN_DIR={run_dir} is invalid: runs without strategy.client_split_guard")
    own = f"{strategy.get('client_score', 'cumulative')} {strategy.get('client_components', 'two')}"
    return Run(run_dir, int(payload["config"]["seed"]), own, int(strategy["t1"]), set(block["true_noisy_clients"]),
               iterations)


def with_checkpoint_disagreement(run: Run) -> Run:
    """``run`` with its last iteration's disagreements as ``client_score=disagreement`` would have asked
    for them: the global model of stage 1's end (its stage-end checkpoint) against the labels each client
    held then (its newest stored labels before that round). A run that recorded them, or whose late
    joiners had an iteration of their own (which reads the others' earlier scores), is left as it is."""
    last = run.iterations[-1]
    if "disagreement" in last.shares or len(run.iterations) != run.t1:
        return run
    payload = json.loads((run.path / "results.json").read_text())
    end = last_round(payload, "preprocess")
    model = GlobalModel.at(run.path, payload, end, "stage 1's end")
    shares = {}
    for client, data in model.clients():
        if client in last.lid:
            held = label_version(run.path, client, end)
            labels = data.labels if held is None else held[1]
            shares[client] = 1.0 - model.scores(data, labels).accuracy
    replayed = replace(last, shares={**last.shares, "disagreement": shares})
    return replace(run, iterations=[*run.iterations[:-1], replayed])


def scores(run: Run, index: int, name: str) -> Scores:
    """The ``name`` score of every client the split at iteration ``index`` reads: the clients that trained
    in it; at the joiners' own iteration, everyone, the others with their last iteration's value."""
    seen = run.iterations[: index + 1]
    own_pass = index >= run.t1
    if name in ("cumulative", "mean"):
        total: dict[int, float] = {}
        visits: dict[int, int] = {}
        for it in seen:
            for pid, value in it.lid.items():
                total[pid] = total.get(pid, 0.0) + value
                visits[pid] = visits.get(pid, 0) + 1
        return {pid: np.array([value / (visits[pid] if name == "mean" else 1)]) for pid, value in total.items()}
    if name == "share_mean":
        shares: dict[int, list[float]] = {}
        for it in seen:
            for pid, value in it.shares.get("loss_share", {}).items():
                shares.setdefault(pid, []).append(value)
        return {pid: np.array([np.mean(values)]) for pid, values in shares.items()}
    latest: dict[int, np.ndarray] = {}
    for it in seen if own_pass else seen[-1:]:
        for pid in it.lid:
            share = {key: it.shares.get(key, {}).get(pid, np.nan) for key in SHARES}
            parts = {"iteration": [it.lid[pid]], **{key: [value] for key, value in share.items()},
                     "2-D": [it.lid[pid], share["loss_share"]]}[name]
            latest[pid] = np.array(parts)
    return latest


def two_d(values: np.ndarray, seed: int) -> np.ndarray:
    """Two Gaussian components on (LID, loss share), standardised; the one with the higher mean share."""
    from sklearn.mixture import GaussianMixture  # lazy: ~1.5 s to import

    spread = values.std(axis=0)
    if values.shape[0] < 2 or not spread.all():
        return np.zeros(values.shape[0], dtype=bool)
    z = (values - values.mean(axis=0)) / spread
    mixture = GaussianMixture(n_components=2, random_state=seed).fit(z)
    return mixture.predict(z) == int(np.argmax(mixture.means_[:, 1]))


Split = Callable[[np.ndarray, int], np.ndarray]
SPLITS: dict[str, Split] = {"two": lambda v, seed: high_component(v[:, 0], seed=seed),
                            "bic": lambda v, seed: above_lowest(v[:, 0], seed=seed),
                            "2-D": two_d}
RULES: dict[str, tuple[str, str]] = {
    "cumulative two": ("cumulative", "two"), "cumulative bic": ("cumulative", "bic"),
    "iteration two": ("iteration", "two"), "mean two": ("mean", "two"),
    "loss_share two": ("loss_share", "two"), "loss_share bic": ("loss_share", "bic"),
    "share_mean two": ("share_mean", "two"), "share_mean bic": ("share_mean", "bic"),
    "LID+share 2-D": ("2-D", "2-D"),
    "disagreement two": ("disagreement", "two"), "disagreement bic": ("disagreement", "bic"),
}


def split(run: Run, index: int, rule: str) -> list[int] | None:
    """The clients ``rule`` flags at iteration ``index`` (None when the run lacks its scores)."""
    score, how = RULES[rule]
    table = scores(run, index, score)
    pids = sorted(table)
    values = np.stack([table[pid] for pid in pids]) if pids else np.zeros((0, 1))
    if np.isnan(values).any() or not pids:
        return None
    flagged = SPLITS[how](values, run.seed)
    return [pid for pid, is_noisy in zip(pids, flagged) if is_noisy]


def replay(run: Run, rule: str) -> list[list[int] | None]:
    """Per iteration, who ``rule`` leaves flagged: the joiners' own iteration keeps the earlier split and
    adds the joiners it flags."""
    out: list[list[int] | None] = []
    for index, it in enumerate(run.iterations):
        flagged = split(run, index, rule)
        if flagged is not None and index >= run.t1 and out and out[-1] is not None:
            flagged = sorted(set(out[-1]) | {pid for pid in flagged if pid in it.lid})
        out.append(flagged)
    return out


def f1(run: Run, flagged: list[int] | None, among: set[int]) -> float | None:
    """Detection F1 of ``flagged`` against the truly noisy clients ``among`` those scored (None: no
    split, or none of them noisy)."""
    if flagged is None:
        return None
    truth = run.noisy & among
    return detection_scores(flagged, truth)["f1"] if truth else None


Final = tuple[float | None, int | None]  # a rule's final detection F1 and clients flagged (None: not replayed)


def report(run: Run) -> dict[str, Final]:
    """Print one run's rules, the run's own first (checked); return each rule's final F1 and flagged count."""
    own = replay(run, run.own_rule)
    for index, (mine, it) in enumerate(zip(own, run.iterations)):
        if mine != it.flagged:
            raise ConfigError(f"RUN_DIR={run.path} is invalid: its own rule ({run.own_rule}) flags "
                              f"{len(mine or [])} clients at iteration {index + 1}, the run flagged {len(it.flagged)}")
    print(f"\n{run.path}: {len(run.noisy)} noisy clients, own rule {run.own_rule} (reproduced)")
    print(f"  {'rule':<16} " + " ".join(f"{f'iteration {i + 1}':>14}" for i in range(len(run.iterations)))
          + f" {'final':>14}")
    finals: dict[str, Final] = {}
    everyone = set().union(*(it.lid for it in run.iterations))
    for rule in [run.own_rule, *(name for name in RULES if name != run.own_rule)]:
        flagged = replay(run, rule)
        cells = [f1(run, flags, set(it.lid if index < run.t1 else everyone))
                 for index, (flags, it) in enumerate(zip(flagged, run.iterations))]
        final = f1(run, flagged[-1], everyone)
        finals[rule] = (final, None if flagged[-1] is None else len(flagged[-1]))
        text = [("-" if value is None else f"{value:.3f}") + ("" if flags is None else f" ({len(flags)})")
                for value, flags in zip([*cells, final], [*flagged, flagged[-1]])]
        print(f"  {rule:<16} " + " ".join(f"{cell:>14}" for cell in text))
    return finals


def summary(finals: Mapping[Path, dict[str, Final]]) -> None:
    """Per rule over the runs with noisy clients: the final F1's mean and lowest, and the runs under
    MIN_F1; over the runs without: the clients flagged in each."""
    print(f"\nfinal detection F1 over the runs with noisy clients: mean, lowest, runs under {MIN_F1}; "
          "clients flagged in the runs without")
    for rule in RULES:
        scored = {path: run[rule][0] for path, run in finals.items() if run[rule][0] is not None}
        clean = [run[rule][1] for run in finals.values()
                 if run[rule][0] is None and run[rule][1] is not None]
        if not scored and not clean:
            continue
        line = f"  {rule:<16}"
        if scored:
            under = [str(path) for path, value in scored.items() if value is not None and value < MIN_F1]
            values = [value for value in scored.values() if value is not None]
            line += (f" {np.mean(values):.3f} {min(values):.3f} {len(under)}/{len(scored)}"
                     + (f" ({', '.join(under)})" if under else ""))
        if clean:
            line += f"; flagged without noisy clients: {clean}"
        print(line)


def main() -> None:
    """Replay every run given, then sum them up."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--from-checkpoint", action="store_true",
                        help="runs that did not record disagreements get their last iteration's from its checkpoint")
    args = parser.parse_args()
    loaded = [load(path) for path in args.runs]
    if args.from_checkpoint:
        loaded = [with_checkpoint_disagreement(run) for run in loaded]
    finals = {run.path: report(run) for run in loaded}
    if len(finals) > 1:
        summary(finals)


if __name__ == "__main__":
    main_with_clear_errors(main)
