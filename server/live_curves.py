"""Live curves while a run goes: an optional TensorBoard writer (``logging.tensorboard=true``).

Writes to ``<out_dir>/tensorboard``:
- the resolved config as hyper-parameters (TensorBoard's HParams tab compares runs by them) and as text;
- each round's test accuracy and loss (when evaluated), train loss, communication cost and stage (its
  index in the order the stages came), over rounds and, under ``by_comm_cost/``, over communication cost;
- every method's detection of noisy clients (``<method>/detected/...``: F1, precision, recall with
  ground truth, and how many clients it flags) whenever the flagged set changes, and every FedCorr iteration's figures
  as soon as the iteration closes (x: the iteration).

A fresh run replaces the folder's earlier events; a resumed run drops the events a killed attempt
wrote after its checkpoint (TensorBoard's ``purge_step``), so no two event streams interleave.
TensorBoard is an optional extra (``pip install -e ".[tensorboard]"``); ``server.config.load_run``
refuses the setting without it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"
HPARAM_TYPES = (bool, int, float, str)


def flat_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """The config's leaves by dotted key, as TensorBoard's HParams take them (None as "null", lists as JSON)."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, HPARAM_TYPES):
            flat[name] = value
        else:
            flat[name] = json.dumps(value)
    return flat


class LiveCurves:
    """A TensorBoard event writer for one run.

    out_dir: the run's folder; result_blocks: the strategy's ``result_blocks`` (its detection, FedCorr's
    iterations); config: the resolved run config; first_round: the first round this attempt runs (1 for
    a fresh run, the checkpoint's round + 1 for a resumed one).
    """

    def __init__(self, out_dir: str, result_blocks: Callable[[], dict[str, Any]], config: Mapping[str, Any],
                 first_round: int = 1) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for
        from torch.utils.tensorboard.summary import hparams

        self.dir = Path(out_dir) / TENSORBOARD_DIR
        if first_round == 1:
            shutil.rmtree(self.dir, ignore_errors=True)  # an earlier run's curves are not this run's
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=None if first_round == 1 else first_round)
        print(f"[tensorboard] events in {self.dir}: tensorboard --logdir {self.dir}", flush=True)
        self.result_blocks = result_blocks
        self.stages: list[str] = []
        self.iterations_written = 0
        self.detections: dict[str, tuple[int, ...]] = {}
        if first_round == 1:
            events = self.writer.file_writer  # made by SummaryWriter's constructor
            assert events is not None
            # The experiment, its session start and end (what add_hparams writes, here in the run's own
            # folder rather than a new one); the metric is the run's own test/accuracy curve.
            for summary in hparams(flat_hparams(config), {"test/accuracy": 0.0}):
                events.add_summary(summary)
            self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")

    def round(self, row: dict[str, Any]) -> None:
        """Log one round's row of results.json, the methods' detections that changed, then any FedCorr
        iteration that closed since."""
        step = int(row["round"])
        if row["stage"] not in self.stages:
            self.stages.append(row["stage"])
        scalars = {"test/accuracy": row.get("test_acc"), "test/loss": row.get("test_loss"),
                   "train/loss": row.get("train_loss"), "run/comm_cost": row.get("comm_cost"),
                   "run/stage": self.stages.index(row["stage"])}
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)
        for tag in ("test/accuracy", "test/loss"):
            if scalars[tag] is not None and row.get("comm_cost") is not None:
                self.writer.add_scalar(f"by_comm_cost/{tag}", scalars[tag], int(row["comm_cost"]))
        blocks = self.result_blocks()
        self._detections(blocks, step)
        self._new_iterations(blocks)
        self.writer.flush()

    def _detections(self, blocks: dict[str, Any], step: int) -> None:
        """Each method's detection (a block with ``detected_noisy_clients``) whenever the set of flagged
        clients changes; before a method first flags anyone nothing is logged (a warm-up is not a
        detection of no noisy client)."""
        for name, block in blocks.items():
            if not isinstance(block, dict) or "detected_noisy_clients" not in block:
                continue
            flagged = tuple(block["detected_noisy_clients"] or ())
            if self.detections.get(name, ()) == flagged:
                continue
            self.detections[name] = flagged
            scores = block.get("detection") or {}
            values = {"flagged_clients": len(flagged),
                      **{key: scores.get(key) for key in ("f1", "precision", "recall")}}
            for key, value in values.items():
                if value is not None:
                    self.writer.add_scalar(f"{name}/detected/{key}", value, step)

    def _new_iterations(self, blocks: dict[str, Any]) -> None:
        """Log the FedCorr iterations that closed since the last call (x: the iteration)."""
        iterations = (blocks.get("fedcorr") or {}).get("iterations") or []
        for record in iterations[self.iterations_written:]:
            for tag, key in (("fedcorr/noise_estimate_mae", "noise_estimate_mae"),
                             ("fedcorr/label_noise", "label_noise"),
                             ("fedcorr/flagged_clients", "detected_noisy_clients")):
                value = record.get(key)
                value = len(value) if isinstance(value, list) else value
                if value is not None:
                    self.writer.add_scalar(tag, value, record["iteration"])
            f1 = (record.get("detection") or {}).get("f1")
            if f1 is not None:
                self.writer.add_scalar("fedcorr/detection_f1", f1, record["iteration"])
        self.iterations_written = len(iterations)

    def close(self) -> None:
        """Log what closed after the last round, then flush and close the event file."""
        self._new_iterations(self.result_blocks())
        self.writer.close()
