"""Live curves while a run goes: an optional TensorBoard writer (``logging.tensorboard=true``).

Writes to ``<out_dir>/tensorboard``: each round's test accuracy and loss (when evaluated), train loss,
communication cost and stage (as its index in the order the stages came), and every FedCorr
iteration's figures as soon as the iteration closes. TensorBoard is an optional extra
(``pip install -e ".[tensorboard]"``); ``server.config.load_run`` refuses the setting without it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"


class LiveCurves:
    """A TensorBoard event writer for one run.

    out_dir: the run's folder; result_blocks: the strategy's ``result_blocks`` (FedCorr's iterations).
    """

    def __init__(self, out_dir: str, result_blocks: Callable[[], dict[str, Any]]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / TENSORBOARD_DIR))
        self.result_blocks = result_blocks
        self.stages: list[str] = []
        self.iterations_written = 0

    def round(self, row: dict[str, Any]) -> None:
        """Log one round's row of results.json, then any FedCorr iteration that closed since."""
        step = int(row["round"])
        if row["stage"] not in self.stages:
            self.stages.append(row["stage"])
        scalars = {"test/accuracy": row.get("test_acc"), "test/loss": row.get("test_loss"),
                   "train/loss": row.get("train_loss"), "run/comm_cost": row.get("comm_cost"),
                   "run/stage": self.stages.index(row["stage"])}
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, value, step)
        self._new_iterations()
        self.writer.flush()

    def _new_iterations(self) -> None:
        """Log the FedCorr iterations that closed since the last call (x: the iteration)."""
        iterations = (self.result_blocks().get("fedcorr") or {}).get("iterations") or []
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
        self._new_iterations()
        self.writer.close()
