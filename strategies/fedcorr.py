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

The stages run as a state machine inside Flower's round loop: ``configure_train`` first closes what
the previous round finished (an iteration's split and corrections, the end of a stage), then builds
the round's messages; ``aggregate_train`` averages and logs the round. ``finish`` closes what the
last round left open. ``docs/fedcorr.md`` maps Algorithm 1 to this code.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from common.errors import InvalidValue
from common.mixture import GUARDS, high_component
from common.validation import Choice, Flag, Integer, Nullable, Number, check_fields, rule, settings_from_mapping
from protocol.codec import ProtocolError
from protocol.fedcorr import CORRECT, LOSS_MODELS, METHOD, CorrectIns, CorrectRes, LidScore, Stage1Options
from protocol.messages import TRAIN, TrainIns, instruction, read_extra, read_reply
from strategies.base import FederatedStrategy, TrainReply
from strategies.environment import Environment
from strategies.fedavg import average_arrays, mean_train_loss
from strategies.fedcorr_metrics import FedCorrMonitor
from strategies.ground_truth import GroundTruth
from strategies.registry import StrategyEntry, parse_training, round_method
from strategies.rounds import RoundSettings
from strategies.sampling import round_size, sample_clients
from task.learner_options import LEARNERS
from task.local_training import PROX_NORMS, LocalTraining

log = logging.getLogger(__name__)

PREPROCESS, FINETUNE, USUAL, DONE = "preprocess", "finetune", "usual", "done"


@dataclass(frozen=True)
class FedCorrAblation:
    """Table 6's ablations: each True keeps that component, as in the paper.

    correction: relabel (False still estimates mu_hat, so S_c and the proximal term work).
    fraction_scheduling: stage 1 in rounds of frac1 N (False: frac2 N).
    local_proximal: the adaptive proximal term (False: weight 0).
    finetuning: the T2 rounds (False skips them but keeps the end-of-stage-2 relabelling).
    usual_training: stage 3. mixup: stage-1 mixup.
    """

    correction: bool = field(default=True, metadata=rule(Flag()))
    fraction_scheduling: bool = field(default=True, metadata=rule(Flag()))
    local_proximal: bool = field(default=True, metadata=rule(Flag()))
    finetuning: bool = field(default=True, metadata=rule(Flag()))
    usual_training: bool = field(default=True, metadata=rule(Flag()))
    mixup: bool = field(default=True, metadata=rule(Flag()))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class FedCorrSettings:
    """FedCorr's hyperparameters (paper Table 7 and Appendix B; ``conf/strategy/fedcorr.yaml``).

    train: the local-SGD settings every stage starts from.
    t1, t2, t3: iterations of stage 1, rounds of stage 2 and of stage 3.
    frac1: stage-1 fraction (None: 1/N, the paper's); frac2: fraction of stages 2-3.
    beta: weight of the adaptive proximal term (5); prox_norm: squared (eq. 5) | l2.
    lid_k: neighbours for the LID estimate (20); mixup_alpha: mixup's Beta(alpha, alpha) (1).
    pi: relabel ratio; theta: confidence threshold; kappa: clean-client threshold on mu_hat (0.1).
    split_losses: whose per-sample losses the noisy-subset GMM splits: ``local`` (the client's model
        right after its stage-1 training, Sec. 3.2) | ``global`` (the end-of-iteration global model).
    rank_losses: whose losses pick the top pi of D_n: ``global`` (eq. 6) | ``local`` (released code).
    client_split_guard: ``none`` (the paper: always split the cumulative LID) | ``bic`` |
        ``separation`` (decline the split when the scores look like one population; common.mixture).
    stage3: the stage-3 strategy (a round-based one); stage3_options: its options.
    stage3_learner: the learner of stage 3 (None: the ``train`` block's, which stage 2 uses too);
        ``stage3=fedlsr`` trains with ``lsr`` on its own. Stage 1 trains with mixup (Sec. 3.2).
    ablation: Table 6's switches.
    """

    train: LocalTraining
    t1: int = field(metadata=rule(Integer(low=1)))
    t2: int = field(metadata=rule(Integer(low=0)))
    t3: int = field(metadata=rule(Integer(low=0)))
    frac1: float | None = field(metadata=rule(Nullable(Number(low=0.0, high=1.0, low_open=True))))
    frac2: float = field(metadata=rule(Number(low=0.0, high=1.0, low_open=True)))
    beta: float = field(metadata=rule(Number(low=0.0)))
    prox_norm: str = field(metadata=rule(Choice(PROX_NORMS)))
    # With one neighbour every LID is 0 (eq. 2 divides by log(r_1 / r_1)): detection would be off.
    lid_k: int = field(metadata=rule(Integer(low=2)))
    mixup_alpha: float = field(metadata=rule(Number(low=0.0)))
    pi: float = field(metadata=rule(Number(low=0.0, high=1.0)))
    theta: float = field(metadata=rule(Number(low=0.0, high=1.0)))
    kappa: float = field(metadata=rule(Number(low=0.0, high=1.0)))
    split_losses: str = field(default="local", metadata=rule(Choice(LOSS_MODELS)))
    rank_losses: str = field(default="global", metadata=rule(Choice(LOSS_MODELS)))
    client_split_guard: str = field(default="none", metadata=rule(Choice(GUARDS)))
    stage3: str = "fedavg"
    stage3_options: Any = None
    stage3_learner: str | None = field(default=None, metadata=rule(Nullable(Choice(LEARNERS))))
    ablation: FedCorrAblation = FedCorrAblation()

    def __post_init__(self) -> None:
        check_fields(self)
        if self.train.peers:
            raise InvalidValue("train.learner", self.train.learner,
                               "a learner of one network: FedCorr's stages 1-2 train and query one "
                               "network (set stage3_learner=coteaching for stage 3)")
        if self.stage3_learner is not None:
            try:
                self.train.but(learner=self.stage3_learner)
            except InvalidValue as err:
                raise err.under("train") from None

    def stage1_round_size(self, num_clients: int) -> int:
        """m1; without fraction scheduling stage 1 visits clients with the larger frac2."""
        fraction = self.frac2 if not self.ablation.fraction_scheduling else (self.frac1 or 1.0 / num_clients)
        return round_size(fraction, num_clients)

    def stage3_rounds(self, num_clients: int) -> RoundSettings:
        """Stage 3's schedule: T3 rounds at frac2, or with ``comm_budget`` what stages 1-2 leave."""
        train = self.train if self.stage3_learner is None else self.train.but(learner=self.stage3_learner)
        return RoundSettings(train=train, num_rounds=self.t3, fraction=self.frac2)

    def t3_under(self, comm_budget: int | None, num_clients: int) -> int:
        """T3, or with a budget the stage-3 rounds left after stage 1 (T1 * N) and stage 2 (T2 * m)."""
        rounds = self.stage3_rounds(num_clients)
        finetuning = self.t2 * rounds.round_size(num_clients) if self.ablation.finetuning else 0
        return rounds.rounds_under(comm_budget, num_clients, self.t1 * num_clients + finetuning,
                                   "FedCorr's stages 1-2")


class FedCorr(FederatedStrategy):
    """The three-stage FedCorr strategy.

    settings: FedCorrSettings.
    stage3: the strategy of stage 3; it shares FedCorr's run log, so rounds and cost run on.
    seed: the run's seed (the LID GMM's random_state; clients derive their loss-GMM seeds from it).
    truth: ground truth of the simulated scene, for detection/correction metrics; None without.
    rng, skip_failed: see ``FederatedStrategy``.
    """

    def __init__(
        self,
        *,
        settings: FedCorrSettings,
        stage3: FederatedStrategy,
        seed: int,
        truth: GroundTruth | None,
        rng: np.random.Generator,
        skip_failed: bool = False,
    ) -> None:
        super().__init__(rng=rng, skip_failed=skip_failed)
        stage3.log = self.log
        self.settings = settings
        self.stage3 = stage3
        self.seed = seed
        self.truth = truth
        self.monitor: FedCorrMonitor | None = None
        self.stage = PREPROCESS
        self.iteration = 1
        self.mu_hat: dict[int, float] = {}
        self.cumulative: dict[int, float] = {}
        self.clean: list[int] = []
        self._chunks: list[list[int]] = []  # this iteration's rounds, in order
        self._next_chunk = 0
        self._iteration_start = 0  # the first round of the current stage-1 iteration
        self._lid: dict[int, float] = {}
        self._finetune_left = 0
        self._grid: Grid | None = None

    def bind(self, federation) -> None:
        """Bind the federation here and in stage 3; every client starts with mu_hat = 0 and no LID."""
        super().bind(federation)
        self.stage3.bind(federation)
        self.monitor = FedCorrMonitor(federation.partition_ids, self.truth)
        self.mu_hat = dict.fromkeys(federation.partition_ids, 0.0)
        self.cumulative = dict.fromkeys(federation.partition_ids, 0.0)

    def summary(self) -> None:
        """Log FedCorr's settings."""
        log.info("FedCorr: %s", self.settings)

    def planned_rounds(self) -> int:
        """Stage 1's T1 iterations of N/m1 rounds, then the T2 and stage-3 rounds the ablation keeps."""
        n = len(self.federation.partition_ids)
        s, ablation = self.settings, self.settings.ablation
        stage1 = s.t1 * math.ceil(n / s.stage1_round_size(n))
        return (stage1 + (s.t2 if ablation.finetuning else 0)
                + (self.stage3.planned_rounds() if ablation.usual_training else 0))

    def extra_results(self) -> dict[str, Any]:
        """Stage 3's blocks (if it runs) and FedCorr's detection and correction metrics."""
        extra = self.stage3.extra_results() if self.settings.ablation.usual_training else {}
        return {**extra, "fedcorr": self.monitor.results()} if self.monitor else extra

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int | None = None,
              timeout: float = 3600, *args: Any, **kwargs: Any) -> Result:
        """Run all three stages in Flower's loop; stage 3's exchanges wait at most ``timeout`` too."""
        self.stage3.timeout = float(timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, *args, **kwargs)

    # --- Flower's round hooks ------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Close what the last round finished, then send the current stage's round: stage 1's next
        chunk of clients, a stage-2 sample of S_c, or stage 3's own round."""
        self._grid = grid
        self._settle(arrays)
        self.global_arrays = arrays
        if self.stage == USUAL:
            return self.stage3.configure_train(server_round, arrays, config, grid)
        if self.stage == PREPROCESS:
            if not self._chunks:
                clients = self.federation.partition_ids
                order = [int(pid) for pid in self.rng.permutation(clients)]
                m1 = self.settings.stage1_round_size(len(clients))
                self._chunks = [order[start:start + m1] for start in range(0, len(order), m1)]
                self._iteration_start = server_round
            chunk = self._chunks[self._next_chunk]
            self._next_chunk += 1
            return self.messages({pid: self._stage1_content(server_round, arrays, pid) for pid in chunk}, TRAIN)
        if self.stage == FINETUNE:
            per_round = min(round_size(self.settings.frac2, len(self.federation.partition_ids)), len(self.clean))
            chosen = sample_clients(self.rng, self.clean, per_round)
            train = self.settings.train
            ins = TrainIns(server_round, train, schedule=train.schedule_at(self.settings.t2 - self._finetune_left))
            self._finetune_left -= 1
            content = instruction(ins, arrays=arrays)
            return self.messages({pid: content for pid in chosen}, TRAIN)
        raise RuntimeError(f"FedCorr has no round {server_round}: its {self.planned_rounds()} rounds are done")

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the round's replies (stage 3: its own aggregation); stage 1 also keeps their LID scores."""
        if self.stage == USUAL:
            return self.stage3.aggregate_train(server_round, replies)
        if self.stage == PREPROCESS:
            good = self.collect(replies, self._read_stage1)
            self._lid.update({pid: reply.extra.lid for pid, reply in good.items()})
        else:
            good = self.collect(replies, self.read_train)
        arrays, train_loss = average_arrays(good), mean_train_loss(good)
        self.record_round(server_round, self.stage, list(good), train_loss, arrays)
        return arrays, MetricRecord({"train-loss": train_loss})

    def finish(self, grid: Grid, arrays: ArrayRecord) -> None:
        """Close what the last round left open (e.g. stage 2's relabelling when stage 3 is off)."""
        self._grid = grid
        self._settle(arrays)

    # --- stage 1 -------------------------------------------------------------------------------

    def _stage1_content(self, server_round: int, arrays: ArrayRecord, pid: int) -> RecordDict:
        s, ablation = self.settings, self.settings.ablation
        mixup = ablation.mixup and s.mixup_alpha > 0
        training = s.train.but(
            learner="mixup" if mixup else s.train.learner,
            mixup_alpha=s.mixup_alpha if mixup else s.train.mixup_alpha,
            # mu_hat comes from the previous iteration (eq. 5); clean clients have none.
            prox_weight=s.beta * self.mu_hat[pid] if ablation.local_proximal else 0.0,
            prox_norm=s.prox_norm,
        )
        options = Stage1Options(lid_k=s.lid_k, keep_losses="local" in (s.split_losses, s.rank_losses))
        return instruction(TrainIns(server_round, training, method=METHOD), arrays=arrays,
                           options=options, method=METHOD)

    def _read_stage1(self, content: RecordDict, sender: str) -> TrainReply:
        reply = self.read_train(content, sender)
        return TrainReply(reply.arrays, reply.result, read_extra(content, METHOD, LidScore, sender))

    def _end_iteration(self, arrays: ArrayRecord) -> None:
        """Algorithm 1 lines 8-12: cumulative LID, the client split, noise estimates and relabelling."""
        assert self.monitor is not None
        for pid, value in self._lid.items():
            self.cumulative[pid] += value
        noisy = self._split_clients(self.cumulative)
        self.mu_hat = dict.fromkeys(self.mu_hat, 0.0)
        corrected = self._correct(arrays, noisy, "stage1")
        self.mu_hat.update({pid: float(res.mu_hat) for pid, res in corrected.items() if res.mu_hat is not None})
        self.monitor.end_iteration(self.iteration, self._lid, self.cumulative, noisy, self.mu_hat)
        self.iteration += 1
        self._chunks, self._next_chunk, self._lid = [], 0, {}

    def _split_clients(self, cumulative: Mapping[int, float]) -> list[int]:
        """The clients in the higher-mean GMM component of the cumulative LID scores (none when the
        guard, if any, finds one population)."""
        pids = sorted(cumulative)
        guard = self.settings.client_split_guard
        flagged = high_component(np.array([cumulative[pid] for pid in pids]), seed=self.seed, guard=guard)
        if guard != "none" and not flagged.any():
            log.info("FedCorr: the %s guard finds one population in the cumulative LID; no client is flagged",
                     guard)
        return [pid for pid, is_noisy in zip(pids, flagged) if is_noisy]

    # --- stage 2 -------------------------------------------------------------------------------

    def _start_finetuning(self) -> None:
        """S_c = {k : mu_hat_k <= kappa}; an empty S_c falls back to the lowest-mu_hat clients."""
        assert self.monitor is not None
        s, clients = self.settings, self.federation.partition_ids
        self.monitor.end_stage("after_stage1")
        clean = [pid for pid in clients if self.mu_hat[pid] <= s.kappa]
        if not clean:
            m2 = round_size(s.frac2, len(clients))
            clean = sorted(sorted(clients, key=lambda pid: (self.mu_hat[pid], pid))[:m2])
            log.warning("no client has mu_hat <= kappa=%s; finetuning on the %d lowest-mu_hat clients %s",
                        s.kappa, len(clean), clean)
        self.clean = clean
        self.monitor.clean_set(clean)
        self.stage = FINETUNE
        self._finetune_left = s.t2 if s.ablation.finetuning else 0

    def _end_finetuning(self, arrays: ArrayRecord) -> None:
        """Algorithm 1 line 18: clients outside S_c relabel every confident sample."""
        assert self.monitor is not None
        clean = set(self.clean)
        self._correct(arrays, [pid for pid in self.federation.partition_ids if pid not in clean], "stage2")
        self.monitor.end_stage("after_stage2")
        self.stage = USUAL if self.settings.ablation.usual_training else DONE

    # --- shared --------------------------------------------------------------------------------

    def _settle(self, arrays: ArrayRecord) -> None:
        """Close whatever the rounds so far finished: an iteration, stage 1, stage 2 (in that order)."""
        if self.stage == PREPROCESS and self._chunks and self._next_chunk == len(self._chunks):
            self._end_iteration(arrays)
            if self.iteration > self.settings.t1:
                self._start_finetuning()
        if self.stage == FINETUNE and self._finetune_left == 0:
            self._end_finetuning(arrays)

    def _correct(self, arrays: ArrayRecord, clients: list[int], mode: str) -> dict[int, CorrectRes]:
        """``query.correct`` on ``clients``; returns their replies by partition id."""
        if not clients:
            return {}
        assert self._grid is not None and self.monitor is not None
        s = self.settings
        ins = CorrectIns(mode=mode, pi=s.pi, theta=s.theta, relabel=s.ablation.correction,
                         split_losses=s.split_losses, rank_losses=s.rank_losses,
                         losses_since=self._iteration_start, seed=self.seed, diagnostics=self.truth is not None)
        content = instruction(ins, arrays=arrays)

        def read(reply: RecordDict, sender: str) -> CorrectRes:
            res = read_reply(reply, CorrectRes, sender)
            if mode == "stage1" and res.mu_hat is None:
                raise ProtocolError(sender, "mu-hat", "is missing from a stage-1 correction")
            return res

        replies = self.exchange(self._grid, {pid: content for pid in clients}, CORRECT, read)
        self.monitor.corrected(replies, mode)
        return replies


def _parse(cfg: Mapping[str, Any], prefix: str) -> FedCorrSettings:
    stage3 = cfg.get("stage3", "fedavg")
    method = round_method(stage3, f"{prefix}.stage3")
    blocks = cfg.get("stage3_options") or {}
    # Every block is checked, not only the chosen stage 3's: a typo in another is a mistake too.
    for name, block in blocks.items():
        round_method(name, f"{prefix}.stage3_options").parse_options(block or {}, f"{prefix}.stage3_options.{name}")
    options = method.parse_options(blocks.get(stage3) or {}, f"{prefix}.stage3_options.{stage3}")
    ablation = settings_from_mapping(FedCorrAblation, cfg.get("ablation") or {}, f"{prefix}.ablation")
    given = {"train": parse_training(cfg, prefix), "stage3_options": options, "ablation": ablation}
    return settings_from_mapping(FedCorrSettings, cfg, prefix, **given)


def _check(settings: FedCorrSettings, env: Environment) -> None:
    settings.t3_under(env.comm_budget, env.num_clients)
    method = round_method(settings.stage3, "strategy.stage3")
    rounds = settings.stage3_rounds(env.num_clients)
    key = "strategy.train.learner" if settings.stage3_learner is None else "strategy.stage3_learner"
    method.check_learner(rounds.train, settings.stage3, key)
    if method.check is not None:
        method.check(settings.stage3_options, rounds.round_size(env.num_clients), env,
                     f"strategy.stage3_options.{settings.stage3}")


def _build(settings: FedCorrSettings, env: Environment, rng: np.random.Generator) -> FedCorr:
    stage3 = round_method(settings.stage3, "strategy.stage3").make(
        settings.stage3_rounds(env.num_clients), settings.stage3_options, env, rng, stage=USUAL,
        num_rounds=settings.t3_under(env.comm_budget, env.num_clients))
    return FedCorr(settings=settings, stage3=stage3, seed=env.seed, truth=env.truth, rng=rng,
                   skip_failed=env.skip_failed)


# A client's LID compares each prediction with at least one neighbour's.
STRATEGY = StrategyEntry("fedcorr", _parse, _check, _build, min_client_samples=2)
