"""FedCorr (Xu et al., CVPR 2022): pre-processing, finetuning and usual training as one strategy.

Stage 1 (pre-processing, Algorithm 1 lines 1-13): T1 iterations; each shuffles all N clients and
visits them in rounds of m1 = max(1, round(frac1 * N)) clients without replacement (frac1 = 1/N:
one client per round, so the global model becomes that client's weights). Clients train with mixup
and the adaptive proximal term beta * mu_hat_k * ||w - w_global||^2 and return the LID score of
their local model. After each iteration the server adds every client's LID to its cumulative LID,
splits the clients with a 2-component GMM (higher mean = noisy), and each noisy client estimates
its noise level mu_hat and relabels with the global model (``query.correct`` stage1); clean clients
get mu_hat = 0.
Stage 2 (finetuning, lines 14-18): T2 FedAvg rounds over S_c = {k : mu_hat_k <= kappa}, then the
clients outside S_c relabel every confident sample (``query.correct`` stage2).
Stage 3 (usual training, lines 19-20): T3 rounds of the configured stage-3 strategy over all clients.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from common.mixture import high_component
from strategies.base import FederatedStrategy
from strategies.fedavg import average_replies
from strategies.fedcorr_metrics import FedCorrMonitor, GroundTruth
from strategies.utils import round_size, sample_clients

log = logging.getLogger(__name__)

CORRECT_QUERY = f"{MessageType.QUERY}.correct"
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


@dataclass(frozen=True)
class FedCorrSettings:
    """FedCorr's hyperparameters (paper Table 7 and Appendix B) and the ablations of Table 6.

    t1, t2, t3: iterations of stage 1, rounds of stage 2 and of stage 3.
    frac1: stage-1 fraction (None: 1/N, the paper's); frac2: fraction of stages 2-3.
    beta: weight of the adaptive proximal term (5 in the paper); prox_norm: squared | l2.
    lid_k: neighbours for the LID estimate (20); mixup_alpha: mixup's Beta(alpha, alpha) (1).
    pi: relabel ratio; theta: confidence threshold; kappa: clean-client threshold on mu_hat (0.1).
    correction, fraction_scheduling, local_proximal, finetuning, usual_training, mixup: Table 6's
        ablations (each True = the component is on, as in the paper).
    """

    t1: int
    t2: int
    t3: int
    frac1: float | None
    frac2: float
    beta: float
    prox_norm: str
    lid_k: int
    mixup_alpha: float
    pi: float
    theta: float
    kappa: float
    correction: bool = True
    fraction_scheduling: bool = True
    local_proximal: bool = True
    finetuning: bool = True
    usual_training: bool = True
    mixup: bool = True

    def stage1_round_size(self, num_clients: int) -> int:
        """m1; without fraction scheduling stage 1 visits clients with the larger frac2."""
        fraction = self.frac2 if not self.fraction_scheduling else (self.frac1 or 1.0 / num_clients)
        return round_size(fraction, num_clients)


class FedCorr(FederatedStrategy):
    """The three-stage FedCorr strategy; ``start`` runs all stages.

    settings: FedCorrSettings.
    train: the local-SGD settings every stage starts from (TrainConfig keys).
    stage3: the strategy of stage 3; FedCorr logs its rounds into stage 3's round log.
    seed: the run's seed (the LID GMM's random_state; clients derive their loss-GMM seeds from it).
    truth: ground truth of the simulated scene, for detection/correction metrics; None in deployment.
    rng, on_client_error: see ``FederatedStrategy``.
    """

    def __init__(
        self,
        *,
        settings: FedCorrSettings,
        train: dict[str, Any],
        stage3: FederatedStrategy,
        seed: int,
        truth: GroundTruth | None,
        rng: np.random.Generator,
        on_client_error: str = "fail",
    ) -> None:
        # One round log for all stages, so rounds and communication cost run on into stage 3.
        super().__init__(rng=rng, on_client_error=on_client_error, history=stage3.history)
        self.settings = settings
        self.train = dict(train)
        self.stage3 = stage3
        self.seed = seed
        self.truth = truth
        self.monitor: FedCorrMonitor | None = None
        self.mu_hat: dict[int, float] = {}

    def bind(self, federation) -> None:
        super().bind(federation)
        self.stage3.bind(federation)
        self.monitor = FedCorrMonitor(federation.partition_ids, self.truth)

    def summary(self) -> None:
        log.info("FedCorr: %s", self.settings)

    def planned_rounds(self) -> int:
        n = len(self.federation.partition_ids)
        s = self.settings
        stage1 = s.t1 * math.ceil(n / s.stage1_round_size(n))
        return stage1 + (s.t2 if s.finetuning else 0) + (self.stage3.planned_rounds() if s.usual_training else 0)

    def extra_results(self) -> dict[str, Any]:
        extra = self.stage3.extra_results() if self.settings.usual_training else {}
        return {**extra, "fedcorr": self.monitor.results()} if self.monitor else extra

    # Flower's per-round hooks are not how FedCorr runs: ``start`` drives the stages directly.
    def configure_train(self, server_round, arrays, config, grid):
        raise NotImplementedError("FedCorr runs its stages in start()")

    def aggregate_train(self, server_round, replies):
        raise NotImplementedError("FedCorr runs its stages in start()")

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 0,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run stage 1, 2 and 3; ``num_rounds`` is ignored (the stages define the rounds)."""
        self.summary()
        self._grid, self._timeout, self._evaluate_fn = grid, timeout, evaluate_fn
        self._round = 0
        arrays = self._preprocess(initial_arrays)
        arrays = self._finetune(arrays)
        if self.settings.usual_training:
            arrays = self._usual_training(arrays)
        return Result(arrays=arrays)

    # --- stage 1 -------------------------------------------------------------------------------

    def _preprocess(self, arrays: ArrayRecord) -> ArrayRecord:
        s, clients = self.settings, self.federation.partition_ids
        mu_hat = dict.fromkeys(clients, 0.0)
        cumulative = dict.fromkeys(clients, 0.0)
        m1 = s.stage1_round_size(len(clients))
        for iteration in range(1, s.t1 + 1):
            order = [int(pid) for pid in self.rng.permutation(clients)]
            lid: dict[int, float] = {}
            for start in range(0, len(order), m1):
                chunk = order[start:start + m1]
                contents = {pid: self._stage1_content(arrays, pid, mu_hat[pid]) for pid in chunk}
                replies = self.exchange(self._grid, contents, MessageType.TRAIN, self._timeout)
                lid.update({pid: float(content["metrics"]["lid"]) for pid, content in replies.items()})
                arrays = self._finish_round(replies, "preprocess", arrays)
            for pid, value in lid.items():
                cumulative[pid] += value
            noisy = self._split_clients(cumulative)
            for pid in clients:
                mu_hat[pid] = 0.0
            corrected = self._correct(arrays, noisy, "stage1")
            mu_hat.update({pid: float(metrics["mu_hat"]) for pid, metrics in corrected.items()})
            self.monitor.end_iteration(iteration, lid, cumulative, noisy, mu_hat)
        self.mu_hat = mu_hat
        self.monitor.end_stage("after_stage1")
        return arrays

    def _stage1_content(self, arrays: ArrayRecord, pid: int, mu_hat: float) -> RecordDict:
        s = self.settings
        config = {
            **self.train,
            "server-round": self._round + 1,
            "mixup_alpha": s.mixup_alpha if s.mixup else 0.0,
            # mu_hat comes from the previous iteration (eq. 5); clean clients have none.
            "prox_weight": s.beta * mu_hat if s.local_proximal else 0.0,
            "prox_norm": s.prox_norm,
            "compute-lid": True,
            "lid-k": s.lid_k,
        }
        return RecordDict({"arrays": arrays, "config": ConfigRecord(config)})

    def _split_clients(self, cumulative: dict[int, float]) -> list[int]:
        """The clients in the higher-mean GMM component of the cumulative LID scores."""
        pids = sorted(cumulative)
        flagged = high_component(np.array([cumulative[pid] for pid in pids]), seed=self.seed)
        return [pid for pid, is_noisy in zip(pids, flagged) if is_noisy]

    # --- stage 2 -------------------------------------------------------------------------------

    def _finetune(self, arrays: ArrayRecord) -> ArrayRecord:
        s, clients = self.settings, self.federation.partition_ids
        clean = [pid for pid in clients if self.mu_hat[pid] <= s.kappa]
        if not clean:
            m2 = round_size(s.frac2, len(clients))
            clean = sorted(sorted(clients, key=lambda pid: (self.mu_hat[pid], pid))[:m2])
            log.warning("no client has mu_hat <= kappa=%s; finetuning on the %d lowest-mu_hat clients %s",
                        s.kappa, len(clean), clean)
        self.monitor.clean_set(clean)
        if s.finetuning:
            per_round = min(round_size(s.frac2, len(clients)), len(clean))
            for _ in range(s.t2):
                chosen = sample_clients(self.rng, clean, per_round)
                content = RecordDict({"arrays": arrays, "config": ConfigRecord({**self.train, "server-round": self._round + 1})})
                replies = self.exchange(self._grid, {pid: content for pid in chosen}, MessageType.TRAIN, self._timeout)
                arrays = self._finish_round(replies, "finetune", arrays)
        self._correct(arrays, [pid for pid in clients if pid not in set(clean)], "stage2")
        self.monitor.end_stage("after_stage2")
        return arrays

    # --- stage 3 -------------------------------------------------------------------------------

    def _usual_training(self, arrays: ArrayRecord) -> ArrayRecord:
        config = ConfigRecord(dict(self.train))
        for _ in range(self.stage3.planned_rounds()):
            self._round += 1
            messages = self.stage3.configure_train(self._round, arrays, config, self._grid)
            replies = self._grid.send_and_receive(messages, timeout=self._timeout)
            new_arrays, _ = self.stage3.aggregate_train(self._round, replies)
            arrays = new_arrays if new_arrays is not None else arrays
            self._after_round(arrays)
        return arrays

    # --- shared --------------------------------------------------------------------------------

    def _finish_round(self, replies: dict[int, RecordDict], stage: str, arrays: ArrayRecord) -> ArrayRecord:
        """Aggregate one round's replies (FedAvg), log it and run the per-round callback."""
        self._round += 1
        new_arrays, train_loss = average_replies(replies)
        self.record_round(self._round, stage, list(replies), train_loss)
        self._after_round(new_arrays)
        return new_arrays

    def _after_round(self, arrays: ArrayRecord) -> None:
        if self._evaluate_fn is not None:
            self._evaluate_fn(self._round, arrays)

    def _correct(self, arrays: ArrayRecord, clients: list[int], mode: str) -> dict[int, MetricRecord]:
        """``query.correct`` on ``clients``; returns their metrics by partition id."""
        if not clients:
            return {}
        s = self.settings
        config = ConfigRecord({"mode": mode, "pi": s.pi, "theta": s.theta, "relabel": s.correction,
                               "seed": self.seed, "diagnostics": self.truth is not None})
        content = RecordDict({"arrays": arrays, "config": config})
        replies = self.exchange(self._grid, {pid: content for pid in clients}, CORRECT_QUERY, self._timeout)
        metrics = {pid: reply["metrics"] for pid, reply in replies.items()}
        self.monitor.corrected(mode, metrics)
        return metrics

