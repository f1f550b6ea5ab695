"""Live curves to MLflow (``logging.mlflow=true``): one MLflow run per run folder, in the experiment
``logging.mlflow_experiment`` of the tracking store ``logging.mlflow_uri``.

The run's parameters are the resolved config by dotted key (MLflow's compare view lines runs up by
them); its tags say where the run folder is. ``<out_dir>/mlflow_run.json`` names the MLflow run that
holds the folder's curves. MLflow cannot drop logged points, so a rerun into the folder deletes the
MLflow run named there (deleted runs stay in the store until ``mlflow gc``) and starts a new one; a
resumed run starts a new one too, copies into it the points logged before the checkpoint
(``ResumePoint``) and deletes the old one, so a folder's curves are always one stream. A local store is
an SQLite file (the default, ``outputs/mlflow.db``); ``mlflow ui --backend-store-uri <uri>`` (the full
``mlflow`` package) shows it. MLflow's client is an optional extra (``pip install -e ".[mlflow]"``);
``server.config.load_run`` refuses the setting without it; this module is imported only when it is on.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

from common.atomic_files import write_text_atomic
from server.live_curves import ResumePoint, flat_hparams

RUN_RECORD = "mlflow_run.json"
SQLITE = "sqlite:///"


def store_uri(uri: str) -> str:
    """``uri`` with a relative SQLite path made absolute (the run prints it, and the UI needs it whole)."""
    if uri.startswith(SQLITE) and not uri.startswith(SQLITE + "/"):
        return SQLITE + str(Path(uri[len(SQLITE):]).resolve())
    return uri


class MlflowSink:
    """The MLflow run of one run folder.

    out_dir: the run's folder; config: the resolved run config; uri: the tracking store
    (``logging.mlflow_uri``); experiment: the experiment's name (``logging.mlflow_experiment``);
    resume: where a resumed run goes on (None: a fresh run).
    """

    def __init__(self, out_dir: str, config: Mapping[str, Any], uri: str, experiment: str,
                 resume: ResumePoint | None = None) -> None:
        for name in ("mlflow", "alembic"):  # the store's set-up messages are not the run's
            logging.getLogger(name).setLevel(logging.WARNING)
        # SQLAlchemy's notice about a loader MLflow's SQL store uses: MLflow's to act on, not the user's.
        warnings.filterwarnings("ignore", message="The ``noload`` loader strategy", category=DeprecationWarning)
        self.uri = store_uri(uri)
        # The folder of an SQLite store's file: made if missing, and where its artifacts go.
        self.store_dir = Path(self.uri[len(SQLITE):]).parent if self.uri.startswith(SQLITE) else None
        if self.store_dir is not None:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.record = Path(out_dir) / RUN_RECORD
        earlier = self._earlier_run()
        self.run_id = self.client.create_run(
            self._experiment(experiment), run_name=Path(out_dir).name,
            tags={"out_dir": str(Path(out_dir).resolve()), "strategy": str(config["strategy"]["name"]),
                  "seed": str(config["seed"])}).info.run_id
        # A value past MLflow's limit (a long list) is cut; results.json holds it whole.
        params = [Param(key, str(value)[:MAX_PARAM_VAL_LENGTH]) for key, value in sorted(flat_hparams(config).items())]
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start:start + MAX_PARAMS_TAGS_PER_BATCH])
        if earlier is not None and resume is not None:
            self._copy_kept(earlier, resume)
        if earlier is not None:
            self.client.delete_run(earlier)
        write_text_atomic(self.record, json.dumps({"tracking_uri": self.uri, "run_id": self.run_id}) + "\n")
        self.pending: list[Metric] = []
        print(f"[mlflow] run {self.run_id} in experiment {experiment!r} at {self.uri}: mlflow ui "
              f"--backend-store-uri {self.uri}", flush=True)

    def _earlier_run(self) -> str | None:
        """The MLflow run that the folder's record names, if it is in this store and not deleted."""
        if not self.record.exists():
            return None
        named = json.loads(self.record.read_text())
        if named.get("tracking_uri") != self.uri:
            return None
        try:
            run = self.client.get_run(named["run_id"])
        except MlflowException:
            return None  # removed from the store since
        return run.info.run_id if run.info.lifecycle_stage == "active" else None

    def _experiment(self, name: str) -> str:
        """The id of experiment ``name``, made if new (an SQLite store keeps its artifacts beside the file)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        location = None if self.store_dir is None else (self.store_dir / "mlartifacts").as_uri()
        return str(self.client.create_experiment(name, artifact_location=location))

    def _copy_kept(self, earlier: str, resume: ResumePoint) -> None:
        """Copy into this run every point the earlier run logged before the checkpoint."""
        for key in self.client.get_run(earlier).data.metrics:
            kept = [Metric(key, point.value, point.timestamp, point.step)
                    for point in self.client.get_metric_history(earlier, key) if resume.keeps(key, point.step)]
            for start in range(0, len(kept), MAX_METRICS_PER_BATCH):
                self.client.log_batch(self.run_id, metrics=kept[start:start + MAX_METRICS_PER_BATCH])

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One point of curve ``tag`` (sent with the round's others at ``flush``)."""
        self.pending.append(Metric(tag, float(value), get_current_time_millis(), step))

    def flush(self) -> None:
        """Send the points logged since the last flush, in one request."""
        if self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending)
            self.pending = []

    def close(self, finished: bool) -> None:
        """Send what is left and mark the MLflow run finished, or failed if the run ended early."""
        self.flush()
        status = RunStatus.FINISHED if finished else RunStatus.FAILED
        self.client.set_terminated(self.run_id, RunStatus.to_string(status))
