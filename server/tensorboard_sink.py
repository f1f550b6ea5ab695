"""Live curves to TensorBoard (``logging.tensorboard=true``), in ``<out_dir>/tensorboard``.

The round curves are in that folder; the curves over communication cost and over FedCorr's
iterations are in its sub-folders ``by_comm_cost`` and ``iterations`` (TensorBoard shows each as a
run of its own), because a resumed run drops what a killed attempt wrote after its checkpoint per
folder (TensorBoard's ``purge_step``), and each axis resumes at its own step. The resolved config goes
in as hyper-parameters (the HParams tab compares runs by them, against each run's test/accuracy) and
as text. A fresh run replaces the folder's earlier events. TensorBoard is an optional extra
(``pip install -e ".[tensorboard]"``); ``server.config.load_run`` refuses the setting without it; this
module is imported only when it is on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from server.live_curves import Axis, ResumePoint, axis, flat_hparams

TENSORBOARD_DIR = "tensorboard"
AXIS_DIRS: dict[Axis, str] = {"round": "", "comm_cost": "by_comm_cost", "iteration": "iterations"}


class TensorBoardSink:
    """TensorBoard event writers for one run, one per x-axis.

    out_dir: the run's folder; config: the resolved run config; resume: where a resumed run goes on
    (None: a fresh run).
    """

    def __init__(self, out_dir: str, config: Mapping[str, Any], resume: ResumePoint | None = None) -> None:
        self.dir = Path(out_dir) / TENSORBOARD_DIR
        self.resume = resume
        if resume is None:
            shutil.rmtree(self.dir, ignore_errors=True)  # an earlier run's curves are not this run's
        self.writers: dict[Axis, SummaryWriter] = {}
        main = self._writer("round")
        print(f"[tensorboard] events in {self.dir}: tensorboard --logdir {self.dir}", flush=True)
        if resume is None:
            events = main.file_writer  # made by SummaryWriter's constructor
            assert events is not None
            # The experiment, its session start and end (what add_hparams writes, here in the run's own
            # folder rather than a new one); the metric is the run's own test/accuracy curve.
            for summary in hparams(flat_hparams(config), {"test/accuracy": 0.0}):
                events.add_summary(summary)
            main.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```")

    def _writer(self, name: Axis) -> SummaryWriter:
        """The writer of axis ``name``, made when first needed (a run without FedCorr's iterations has no
        ``iterations`` folder)."""
        if name not in self.writers:
            self.writers[name] = SummaryWriter(log_dir=str(self.dir / AXIS_DIRS[name]),
                                               purge_step=None if self.resume is None else getattr(self.resume, name))
        return self.writers[name]

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One point of curve ``tag``, in its axis's folder."""
        self._writer(axis(tag)).add_scalar(tag, value, step)

    def flush(self) -> None:
        """Write the events so far to disk."""
        for writer in self.writers.values():
            writer.flush()

    def close(self, finished: bool) -> None:
        """Flush and close the event files (however the run ended)."""
        for writer in self.writers.values():
            writer.close()
