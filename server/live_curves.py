"""Live curves while a run goes: what a run logs each round, to TensorBoard (``logging.tensorboard``),
MLflow (``logging.mlflow``) or both.

Logged:
- the resolved config as hyper-parameters (each sink's way of comparing runs by them);
- each round's test accuracy and loss (when evaluated), train loss, communication cost and stage (its
  index in the order the stages came), over rounds and, under ``by_comm_cost/``, over communication cost;
- every method's detection of noisy clients (``<method>/detected/...``: F1, precision, recall with
  ground truth, and how many clients it flags) whenever the flagged set changes, and every FedCorr
  iteration's figures as soon as the iteration closes (x: the iteration).

Each curve has an x-axis (``Axis``: round, communication cost or FedCorr iteration). A fresh run
replaces what the folder's earlier run logged; a resumed run keeps, on every axis, what was logged up
to its checkpoint and drops what a killed attempt logged after it (``ResumePoint``), so no two streams
interleave. Each sink says how (``TensorBoardSink``, ``MlflowSink``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from settings.run import RunSettings

HPARAM_TYPES = (bool, int, float, str)
ITERATION_TAGS = {"fedcorr/noise_estimate_mae": "noise_estimate_mae", "fedcorr/label_noise": "label_noise",
                  "fedcorr/flagged_clients": "detected_noisy_clients", "fedcorr/detection_f1": "detection"}
"""FedCorr's per-iteration curves (x: the iteration) and the record key each is read from."""
BY_COMM_COST = "by_comm_cost/"
Axis = Literal["round", "comm_cost", "iteration"]


def axis(tag: str) -> Axis:
    """The x-axis of curve ``tag``: FedCorr's iteration curves, the ``by_comm_cost/`` ones, else rounds."""
    if tag in ITERATION_TAGS:
        return "iteration"
    return "comm_cost" if tag.startswith(BY_COMM_COST) else "round"


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run's curves go on: on each axis, the first step the resumed attempt logs. What
    a killed attempt logged at or after it is dropped; what comes before was logged up to the
    checkpoint and is kept."""

    round: int
    comm_cost: int
    iteration: int

    def keeps(self, tag: str, step: int) -> bool:
        """Whether a point of ``tag`` at ``step`` was logged before the checkpoint."""
        first: int = getattr(self, axis(tag))
        return step < first


def flat_hparams(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """The config's leaves by dotted key, as hyper-parameters (None as "null", lists as JSON)."""
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


class CurveSink(Protocol):
    """Where live curves go; each sink sets itself up for a fresh or a resumed run when it is made."""

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Log ``value`` of curve ``tag`` at ``step``."""

    def flush(self) -> None:
        """Make what was logged so far visible to readers."""

    def close(self, finished: bool) -> None:
        """Flush and release the sink; ``finished``: whether the run completed."""


class LiveCurves:
    """What a run logs, to every sink.

    result_blocks: the strategy's ``result_blocks`` (its detection, FedCorr's iterations); sinks: where
    the curves go; iterations_done: FedCorr iterations closed before this attempt's first round (a
    resumed run's sinks kept them); stages_done: the stages of the rounds before it, in order (so a
    resumed run numbers its stage as the killed attempt did).
    """

    def __init__(self, result_blocks: Callable[[], dict[str, Any]], sinks: Sequence[CurveSink],
                 iterations_done: int = 0, stages_done: Sequence[str] = ()) -> None:
        self.result_blocks = result_blocks
        self.sinks = list(sinks)
        self.stages: list[str] = list(dict.fromkeys(stages_done))
        self.iterations_written = iterations_done
        self.detections: dict[str, tuple[int, ...]] = {}

    def _scalar(self, tag: str, value: float, step: int) -> None:
        for sink in self.sinks:
            sink.scalar(tag, value, step)

    def round(self, row: dict[str, Any]) -> None:
        """Log one round's row of results.json, the methods' detections that changed, then any FedCorr
        iteration that closed since."""
        step = int(row["round"])
        if row["stage"] not in self.stages:
            self.stages.append(row["stage"])
        scalars: dict[str, float | None] = {"test/accuracy": row.get("test_acc"), "test/loss": row.get("test_loss"),
                                            "train/loss": row.get("train_loss"),
                                            "run/comm_cost": row.get("comm_cost"),
                                            "run/stage": self.stages.index(row["stage"])}
        for tag, value in scalars.items():
            if value is not None:
                self._scalar(tag, value, step)
        for tag in ("test/accuracy", "test/loss"):
            value = scalars[tag]
            if value is not None and row.get("comm_cost") is not None:
                self._scalar(f"{BY_COMM_COST}{tag}", value, int(row["comm_cost"]))
        blocks = self.result_blocks()
        self._detections(blocks, step)
        self._new_iterations(blocks)
        for sink in self.sinks:
            sink.flush()

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
                    self._scalar(f"{name}/detected/{key}", value, step)

    def _new_iterations(self, blocks: dict[str, Any]) -> None:
        """Log the FedCorr iterations that closed since the last call (x: the iteration)."""
        for record in fedcorr_iterations(blocks)[self.iterations_written:]:
            for tag, key in ITERATION_TAGS.items():
                value = record.get(key)
                if isinstance(value, list):
                    value = len(value)
                elif isinstance(value, dict):
                    value = value.get("f1")
                if value is not None:
                    self._scalar(tag, value, record["iteration"])
            self.iterations_written += 1

    def close(self, finished: bool) -> None:
        """Log what closed after the last round, then close every sink; ``finished``: whether the run
        completed (else it failed or was interrupted)."""
        self._new_iterations(self.result_blocks())
        for sink in self.sinks:
            sink.close(finished)


def fedcorr_iterations(blocks: dict[str, Any]) -> list[dict[str, Any]]:
    """FedCorr's closed stage-1 iterations in a strategy's result blocks (none for other methods)."""
    return list((blocks.get("fedcorr") or {}).get("iterations") or [])


def open_live_curves(settings: RunSettings, result_blocks: Callable[[], dict[str, Any]],
                     done: Sequence[Mapping[str, Any]]) -> LiveCurves | None:
    """The run's live curves, with a sink per ``logging`` switch that is on (None if none is);
    ``done``: the rows of the rounds finished before this attempt (none for a fresh run)."""
    resume = None
    if done:
        iterations = len(fedcorr_iterations(result_blocks()))
        resume = ResumePoint(int(done[-1]["round"]) + 1, int(done[-1]["comm_cost"]) + 1, iterations + 1)
    sinks: list[CurveSink] = []
    if settings.logging.tensorboard:
        from server.tensorboard_sink import TensorBoardSink

        sinks.append(TensorBoardSink(settings.out_dir, settings.resolved, resume))
    if settings.logging.mlflow:
        from server.mlflow_sink import MlflowSink

        sinks.append(MlflowSink(settings.out_dir, settings.resolved, settings.logging.mlflow_uri,
                                settings.logging.mlflow_experiment, resume))
    if not sinks:
        return None
    return LiveCurves(result_blocks, sinks, resume.iteration - 1 if resume else 0, [row["stage"] for row in done])
