"""FedCorr's stage-2 relabelling replayed on runs past stage 2 under other rules: how much label noise
each rule would leave, and the floor no keep-or-relabel rule can go under with that run's global model.

    .venv/bin/python bench/relabel_rules.py RUN_DIR [RUN_DIR ...]

A run folder of a FedCorr simulation (``ground_truth=true``), finished or stopped in stage 3 (its
results.json holds the method's block as of its last checkpoint), holds what its stage-2 correction
used: the global model at stage 2's end (the stage-end checkpoint), each client's labels before it
(``client_state/``: the node's label versions by round) and the scene's true labels. Every client outside
the finetuning set is corrected again here with that model's softmax outputs on its samples
(evaluation transforms, as the client computes them), once per rule; the other clients' labels stay as
the run left them. The run's own rule is replayed first and must give the labels the run stored, sample for
sample, or the script stops: the replay then reads the run as it happened.

Rules (each decides per sample between the label it has and the model's argmax):
- ``theta=<t>``: the argmax where the max probability is >= t (the paper: t = strategy.theta, 0.5);
- ``stage2_keep=<k>``: as the paper, but a label the model gives probability >= k stays (the switch
  ``strategy.stage2_keep``, through the client's own function);
- ``keep 2nd, margin<<d>``: as the paper, but a label that is the model's second choice within d of the
  first stays;
- ``floor``: the argmax exactly where it is right and the label is not; what any such rule leaves at best.

Prints per run and rule: labels changed, their precision, and the label noise over all samples after
stage 2 (as results.json's ``label_noise.after_stage2``), with the part of that noise on the clients
stage 2 does not correct (the finetuning set), which no rule here touches; with several runs, then per
rule the mean label noise and its change against the paper's rule.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from finished_run import GlobalModel, label_version, last_round
from runs import ConfigError, main_with_clear_errors

from common.run_files import read_payload
from task.correction import stage2_relabel

Rule = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (labels, probabilities) -> the new labels
PAST_STAGE2 = "allowed is the folder of a FedCorr run past stage 2 (finished, or stopped in stage 3)"


def theta_rule(theta: float, keep: float | None = None) -> Rule:
    """The client's stage-2 correction: the argmax where the max probability is >= theta (the paper),
    but with ``keep`` (strategy.stage2_keep) where the label's own probability is under keep."""
    def rule(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
        return stage2_relabel(labels, probabilities, theta=theta, keep=keep)[0]
    return rule


def keep_second(theta: float, margin: float) -> Rule:
    """The paper's rule, but a label that is the model's second choice within ``margin`` of its first stays."""
    def rule(labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
        order = np.argsort(-probabilities, axis=1, kind="stable")
        first = probabilities[np.arange(labels.size), order[:, 0]]
        second = probabilities[np.arange(labels.size), order[:, 1]]
        close = (order[:, 1] == labels) & (first - second < margin)
        return np.where(close, labels, theta_rule(theta)(labels, probabilities))
    return rule


@dataclass(frozen=True)
class Stage2:
    """What a run's stage-2 correction saw: per corrected client, its true labels, its labels before
    and after, and the global model's probabilities; and the labels of every other client."""

    theta: float
    keep: float | None
    corrected: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    others_wrong: int
    samples: int


def stage2(run_dir: Path) -> Stage2:
    """Read what the run's stage-2 correction used (see the module's docstring)."""
    payload = read_payload(run_dir)
    stages = {row.get("stage") for row in payload["rounds"]}
    if "fedcorr" not in payload or "finetune" not in stages:
        raise ConfigError(f"RUN_DIR={run_dir} is invalid: {PAST_STAGE2}")
    config, block = payload["config"], payload["fedcorr"]
    end = last_round(payload, "finetune")
    if not payload.get("complete") and max(row["round"] for row in payload["rounds"]) == end:
        raise ConfigError(f"RUN_DIR={run_dir} is invalid: it stopped in stage 2, after round {end}; {PAST_STAGE2}")
    model = GlobalModel.at(run_dir, payload, end, "stage 2's end")
    finetuned = set(block["finetune_clients"])
    corrected, others_wrong = {}, 0
    for client, data in model.clients():
        after = label_version(run_dir, client, None)
        if client in finetuned:
            labels = data.labels if after is None else after[1]
            others_wrong += int(np.sum(labels != data.true_labels))
            continue
        if after is None or after[0] <= end:
            raise ConfigError(f"{run_dir}: client {client} was corrected in stage 2 but keeps no labels from after it")
        before = label_version(run_dir, client, after[0])
        labels = data.labels if before is None else before[1]
        corrected[client] = (data.true_labels, labels, after[1], model.probabilities(data, labels))
    return Stage2(float(config["strategy"]["theta"]), config["strategy"].get("stage2_keep"), corrected, others_wrong,
                  len(model.scene.true_labels))


def replay(run: Stage2, rule: Rule | None) -> tuple[int, int, int]:
    """(labels changed, of them right, wrong labels over all samples) under ``rule`` (None: the floor)."""
    changed = right = wrong = 0
    for truth, labels, _, probabilities in run.corrected.values():
        if rule is None:
            predicted = probabilities.argmax(axis=1)
            new = np.where((labels != truth) & (predicted == truth), predicted, labels)
        else:
            new = rule(labels, probabilities)
        moved = new != labels
        changed += int(moved.sum())
        right += int(np.sum(moved & (new == truth)))
        wrong += int(np.sum(new != truth))
    return changed, right, wrong + run.others_wrong


def rules(theta: float) -> dict[str, Rule | None]:
    """The rules compared, the paper's first."""
    return {f"theta={theta:g} (paper)": theta_rule(theta),
            **{f"theta={t:g}": theta_rule(t) for t in (0.7, 0.9) if t > theta},
            **{f"stage2_keep={k:g}": theta_rule(theta, k) for k in (0.05, 0.1, 0.2, 0.3)},
            **{f"keep 2nd, margin<{d:g}": keep_second(theta, d) for d in (0.2, 0.5)},
            "floor": None}


def check_replay(run_dir: Path, run: Stage2) -> None:
    """The run's own rule must give the labels it stored after stage 2, on every corrected client."""
    paper = theta_rule(run.theta, run.keep)
    differ = [client for client, (_, labels, after, probabilities) in run.corrected.items()
              if not np.array_equal(paper(labels, probabilities), after)]
    if differ:
        raise ConfigError(f"{run_dir}: replaying stage 2 with theta={run.theta:g} does not give the stored labels "
                          f"of clients {differ[:8]}; another rule (strategy.stage2_rows?) or model made them")


def report(run_dir: Path) -> list[dict[str, Any]]:
    """Print one run's table; return its rows."""
    run = stage2(run_dir)
    check_replay(run_dir, run)
    truth = np.concatenate([truth for truth, *_ in run.corrected.values()])
    predicted = np.concatenate([probabilities.argmax(axis=1) for *_, probabilities in run.corrected.values()])
    print(f"\n{run_dir}: {len(run.corrected)} clients corrected in stage 2 ({truth.size} samples, the model's argmax "
          f"right on {100 * np.mean(predicted == truth):.2f}%); the finetuning set's wrong labels "
          f"{100 * run.others_wrong / run.samples:.2f}% of all samples")
    print(f"{'rule':<24} {'changed':>8} {'precision':>9} {'label noise':>11}")
    rows = []
    for name, rule in rules(run.theta).items():
        changed, right, wrong = replay(run, rule)
        precision = right / changed if changed else float("nan")
        print(f"{name:<24} {changed:>8} {precision:>9.3f} {100 * wrong / run.samples:>10.2f}%")
        rows.append({"rule": name, "changed": changed, "precision": precision, "noise": wrong / run.samples})
    return rows


def main() -> None:
    """Print the table of each run given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tables = [report(run_dir) for run_dir in args.runs]
    if len({tuple(row["rule"] for row in table) for table in tables}) > 1:
        print("\nthe runs' thetas differ, so their rules do: no summary over them")
    elif len(tables) > 1:
        print(f"\nover the {len(tables)} runs: label noise % per rule, and its change against the paper's rule "
              "(mean, lowest, highest; negative: less noise)")
        for rows in zip(*tables):
            noise = np.array([100 * row["noise"] for row in rows])
            change = noise - np.array([100 * table[0]["noise"] for table in tables])
            print(f"{rows[0]['rule']:<24} {noise.mean():>6.2f}   {change.mean():+.2f} "
                  f"({change.min():+.2f} to {change.max():+.2f})")


if __name__ == "__main__":
    main_with_clear_errors(main)
