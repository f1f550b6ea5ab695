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

The stages run as a state machine inside the round loop: ``configure_train`` first closes what
the previous round finished (an iteration's split and corrections, the end of a stage), then builds
the round's messages; ``aggregate_train`` averages and logs the round. ``finish`` closes what the
last round left open. ``docs/fedcorr.md`` maps Algorithm 1 to this code.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from common.errors import ConfigError, InvalidValue
from common.mixture import GUARDS, above_lowest, high_component
from common.validation import Checked, Flag, FolderPath, Interval, Options, from_mapping, option
from protocol.codec import ProtocolError
from protocol.fedcorr import CORRECT, LOSS_MODELS, PLUGIN, STAGE2_ROWS, CorrectIns, CorrectRes, LidRes, Stage1Ins
from protocol.messages import LOSS, TRAIN, TrainIns, instruction, read_extra, read_reply
from strategies.base import FederatedStrategy, StrategySettings, TrainReply
from strategies.context import StrategyContext
from strategies.fedavg import FedAvg, average_arrays, mean_train_loss
from strategies.fedcorr_metrics import FedCorrMonitor
from strategies.federation import Federation
from strategies.participation import Participation
from strategies.registry import strategy_classes
from strategies.rounds import RoundSettings, rounds_left
from strategies.sampling import round_size, sample_clients
from task.learner_settings import LEARNERS
from task.local_training import PROX_NORMS, LocalTraining
from task.scores import Scores

log = logging.getLogger(__name__)

PREPROCESS, FINETUNE, USUAL, DONE = "preprocess", "finetune", "usual", "done"
# When stage 1 evaluates the global model: after every round, or after each iteration's last round.
STAGE1_EVAL = ("round", "iteration")


@dataclass(frozen=True)
class FedCorrAblation(Checked):
    """Table 6's ablations: each true keeps that component, as in the paper."""

    correction: bool = option(Flag(), "relabel (false still estimates mu_hat, so S_c and the proximal term work)")
    fraction_scheduling: bool = option(Flag(), "stage 1 in rounds of frac1 N (false: frac2 N)")
    local_proximal: bool = option(Flag(), "the adaptive proximal term (false: weight 0)")
    finetuning: bool = option(Flag(), "the T2 rounds (false skips them, keeping the end-of-stage-2 relabelling)")
    usual_training: bool = option(Flag(), "stage 3")
    mixup: bool = option(Flag(), "stage-1 mixup")


def stage3_classes() -> dict[str, type[FedAvg]]:
    """The strategies FedCorr may run as its stage 3: the round-based ones without stages of their own."""
    return {name: cls for name, cls in strategy_classes().items() if issubclass(cls, FedAvg) and cls.stage3}


EVERYONE = Participation()
_SHARE = Interval(float, 0.0, 1.0)
_FRACTION = Interval(float, 0.0, 1.0, closed="right")
CLIENT_SCORES = ("cumulative", "iteration", "mean", "loss_share", "disagreement")
# The scores a client reports as a share in [0, 1] of its samples, one per iteration it trains in.
SHARE_SCORES = ("loss_share", "disagreement")
CLIENT_COMPONENTS = ("two", "bic")
JOINERS = ("as_clean", "preprocess")


@dataclass(frozen=True)
class FedCorrSettings(StrategySettings):
    """FedCorr's settings (paper Table 7 and Appendix B; ``conf/strategy/fedcorr.yaml``). Stage 1 trains
    with mixup (Sec. 3.2); ``stage3=fedlsr`` trains with ``lsr`` on its own."""

    train: LocalTraining = option(meaning="the local training every stage starts from")
    t1: int = option(Interval(int, 1), "stage-1 iterations (every client trains once per iteration)")
    t2: int = option(Interval(int, 0), "stage-2 (finetuning) rounds")
    t3: int = option(Interval(int, 0), "stage-3 (usual training) rounds")
    frac1: float | None = option(Interval(float, 0.0, 1.0, closed="right", or_none=True),
                                 "stage-1 fraction (null: 1/N, one client per round, the paper's)")
    frac2: float = option(_FRACTION, "the fraction of stages 2 and 3")
    beta: float = option(Interval(float, 0.0), "weight of the adaptive proximal term beta * mu_hat_k (stage 1)")
    prox_norm: str = option(Options(PROX_NORMS), "squared (eq. 5) | l2 (the unsquared norm)")
    # With one neighbour every LID is 0 (eq. 2 divides by log(r_1 / r_1)): detection would be off.
    lid_k: int = option(Interval(int, 2), "neighbours of the LID estimate")
    mixup_alpha: float = option(Interval(float, 0.0), "stage-1 mixup's Beta(alpha, alpha)")
    pi: float = option(_SHARE, "the relabel ratio")
    theta: float = option(_SHARE, "the confidence threshold")
    kappa: float = option(_SHARE, "the clean-client threshold on mu_hat for finetuning")
    split_losses: str = option(Options(LOSS_MODELS), "whose per-sample losses the noisy-sample GMM splits: "
                                                     "local (Sec. 3.2) | global")
    rank_losses: str = option(Options(LOSS_MODELS), "whose losses pick the top pi of the noisy subset: "
                                                    "global (eq. 6) | local")
    stage2_rows: str = option(Options(STAGE2_ROWS), "which samples the end-of-stage-2 correction may relabel: "
                                                    "all (Sec. 3.3) | noisy_subset (a loss GMM's, as stage 1)")
    stage2_keep: float | None = option(Interval(float, 0.0, 1.0, closed="right", or_none=True),
                                       "in the end-of-stage-2 correction, a label the global model gives a "
                                       "probability >= this stays (null: none does, Sec. 3.3)")
    client_split_guard: str = option(Options(GUARDS), "none (the paper: always split) | bic | separation")
    client_score: str = option(Options(CLIENT_SCORES), "what stage 1 splits the clients on: cumulative (the "
                                                      "running sum of LID, Sec. 3.2) | iteration (this "
                                                      "iteration's LID alone) | mean (the running sum over "
                                                      "the client's stage-1 iterations) | loss_share (the "
                                                      "share of its samples its loss GMM finds noisy) | "
                                                      "disagreement (the share of its labels the global model's "
                                                      "prediction differs from, at the iteration's end)")
    client_components: str = option(Options(CLIENT_COMPONENTS), "two (the paper's 2-component GMM) | bic (1 to 3 "
                                                                "components by BIC; all but the lowest flagged)")
    joiners: str = option(Options(JOINERS), "clients that join after stage 1: as_clean (the paper's rule: no "
                                            "LID, mu_hat 0, so finetuned on) | preprocess (a stage-1 "
                                            "iteration of their own first, split with everyone's scores)")
    stage1_eval: str = option(Options(STAGE1_EVAL), "when the server evaluates the global model in stage 1: "
                                                    "round (after every round) | iteration (after each "
                                                    "iteration's last round only)")
    stage3: str = option(meaning="the stage-3 strategy: a round-based one without stages of its own")
    stage3_options: dict[str, dict[str, object]] = option(
        meaning="each stage-3 strategy's own options, by name (every block is checked)")
    stage3_learner: str | None = option(Options(LEARNERS, or_none=True),
                                        "stage 3's learner (null: train.learner, as stage 2)")
    ablation: FedCorrAblation = option(meaning="Table 6's switches")
    stages12_from: str | None = option(FolderPath(or_none=True),
                                       "a finished FedCorr run's folder whose stages 1-2 this run takes over "
                                       "(null: run them)")

    # What only stage 3 reads: a run may differ from the one it takes stages 1-2 from in these.
    stage3_keys = ("stage3", "stage3_options", "stage3_learner", "t3", "ablation.usual_training", "stages12_from")

    def check(self) -> None:
        """One network in stages 1-2, a stage-3 learner the train block allows, and every stage-3
        block valid for its strategy."""
        if self.client_components != "two" and self.client_split_guard != "none":
            raise InvalidValue("client_split_guard", self.client_split_guard,
                               "none with client_components=bic, which picks the number of components itself")
        if self.train.peers:
            raise InvalidValue("train.learner", self.train.learner,
                               "a learner of one network: FedCorr's stages 1-2 train and query one "
                               "network (set stage3_learner=coteaching for stage 3)")
        if self.stage3_learner is not None:
            try:
                self.train.but(learner=self.stage3_learner)
            except InvalidValue as err:
                raise err.under("train") from None
        self.stage3_class()
        for name in self.stage3_options:
            self.stage3_settings(name)

    def check_joiners(self, context: StrategyContext) -> None:
        """Late joiners come in at a stage-1 iteration's first round or at stage 2's, and not into a run
        that takes over another run's stages 1-2."""
        participation = context.participation
        if not participation.late:
            return
        latest = self.stage1_ends(context.num_clients, participation)[self.t1 - 1] + 1
        if not participation.joins_by(latest):
            raise ConfigError(f"participation.join_round={participation.join_round} is invalid: at most {latest} "
                              "with strategy=fedcorr (joiners come in at a stage-1 iteration's first round or at "
                              f"stage 2's, round {latest})")
        if self.stages12_from is not None:
            raise ConfigError(f"participation.late={participation.share(context.num_clients):g} is invalid: "
                              "0 with strategy.stages12_from (the run taken over planned its stages without them)")

    def stage3_class(self, name: str | None = None) -> type[FedAvg]:
        """The class of stage-3 strategy ``name`` (default: ``stage3``; another name is a key of
        ``stage3_options``)."""
        key, name = ("stage3", self.stage3) if name is None else ("stage3_options", name)
        classes = stage3_classes()
        if name not in classes:
            raise InvalidValue(key, name, f"allowed are {', '.join(classes)}")
        return classes[name]

    def stage3_training(self) -> LocalTraining:
        """Stage 3's local training: the train block's, with ``stage3_learner`` if set."""
        return self.train if self.stage3_learner is None else self.train.but(learner=self.stage3_learner)

    def stage3_settings(self, name: str | None = None, rounds: int = 1) -> RoundSettings:
        """The settings of stage-3 strategy ``name`` (default: ``stage3``): ``rounds`` rounds at frac2
        (what its own options allow does not depend on them), and its options from ``stage3_options``."""
        cls = self.stage3_class(name)
        block = self.stage3_options.get(cls.name) or {}
        settings = from_mapping(cls.settings_type(), block, f"stage3_options.{cls.name}",
                                train=self.stage3_training(), num_rounds=rounds, fraction=self.frac2, min_clients=1)
        assert isinstance(settings, RoundSettings)
        return settings

    def stage1_sizes(self, num_clients: int, participation: Participation = EVERYONE) -> list[int]:
        """The clients of each stage-1 iteration: those taking part at its first round. Joiners that
        come after the T1 iterations get one more of their own with ``joiners=preprocess``."""
        m1, clients = self.stage1_round_size(num_clients), range(num_clients)
        sizes, start = [], 1
        for _ in range(self.t1):
            sizes.append(len(participation.present(clients, start)))
            start += math.ceil(sizes[-1] / m1)
        if sizes[-1] < num_clients and self.joiners == "preprocess":
            sizes.append(num_clients - sizes[-1])
        return sizes

    def stage1_ends(self, num_clients: int, participation: Participation = EVERYONE) -> list[int]:
        """The last round of each stage-1 iteration (rounds of m1 clients; the joiners' own included)."""
        m1, sizes = self.stage1_round_size(num_clients), self.stage1_sizes(num_clients, participation)
        return list(itertools.accumulate(math.ceil(size / m1) for size in sizes))

    def stage1_round_size(self, num_clients: int) -> int:
        """m1; without fraction scheduling stage 1 visits clients with the larger frac2."""
        fraction = self.frac2 if not self.ablation.fraction_scheduling else (self.frac1 or 1.0 / num_clients)
        return round_size(fraction, num_clients)

    def stages12_rounds(self, num_clients: int, participation: Participation = EVERYONE) -> int:
        """The rounds of stages 1 and 2: the stage-1 iterations in rounds of m1, then the T2 rounds the
        ablation keeps."""
        return self.stage1_ends(num_clients, participation)[-1] + (self.t2 if self.ablation.finetuning else 0)

    def starts_from(self, num_clients: int) -> tuple[str, int] | None:
        """``stages12_from`` and the round its stages 1-2 end at; None when this run does them."""
        return None if self.stages12_from is None else (self.stages12_from, self.stages12_rounds(num_clients))

    def differing_keys(self) -> tuple[str, ...]:
        """The keys of the strategy block a run may change from the run it starts from: stage 3's."""
        return self.stage3_keys

    def stages12_participations(self, num_clients: int, participation: Participation = EVERYONE) -> int:
        """The client participations of stage 1 (T1 * N without late joiners) and stage 2 (T2 * m)."""
        finetuning = self.t2 * round_size(self.frac2, num_clients) if self.ablation.finetuning else 0
        return sum(self.stage1_sizes(num_clients, participation)) + finetuning

    def stage3_rounds(self, context: StrategyContext) -> int:
        """Stage 3's rounds: none without usual training; T3, or with a budget the rounds of frac2 N
        that stage 1 (T1 N participations) and stage 2 (T2 m) leave."""
        if not self.ablation.usual_training:
            return 0
        if context.comm_budget is None:
            return self.t3
        return rounds_left(context.comm_budget,
                           self.stages12_participations(context.num_clients, context.participation),
                           round_size(self.frac2, context.num_clients), "FedCorr's stages 1-2")

    def check_run(self, context: StrategyContext) -> None:
        """Late joiners that come by stage 2, a budget that pays for stages 1-2, and a stage 3 that
        works with its learner and the run."""
        self.check_joiners(context)
        self.stage3_rounds(context)
        key = "strategy.train.learner" if self.stage3_learner is None else "strategy.stage3_learner"
        self.stage3_class().check_learner(self.stage3_training(), key)
        try:
            self.stage3_settings().check_options(context)
        except InvalidValue as err:
            raise err.under(f"stage3_options.{self.stage3}") from None


def share(value: float | None, sender: str, key: str) -> float:
    """``value``, a share a client sent under ``key``; a missing one or one outside [0, 1] is refused."""
    if value is None or not 0 <= value <= 1:
        raise ProtocolError(sender, key, f"is {value}: a share in [0, 1] was asked for")
    return value


class FedCorr(FederatedStrategy):
    """The three-stage FedCorr strategy. Stage 3 is its own strategy (``settings.stage3``; None when it
    has no rounds) sharing FedCorr's run log and sampling generator, so rounds, cost and draws run on;
    its rounds are T3 or what the budget leaves after stages 1-2. The run's seed is the LID GMM's
    random_state (clients derive their loss-GMM seeds from it); the scene's ground truth, if any,
    scores detection and correction."""

    name = "fedcorr"
    settings: FedCorrSettings
    # A client's LID compares each prediction with at least one neighbour's.
    min_client_samples = 2
    # Stage 3 keeps its own state (``state``); the grid is the one of the round in progress.
    transient = FederatedStrategy.transient | {"stage3", "_grid"}
    # None of its own state depends on the budget, which only sizes stage 3.
    budget_sized = frozenset()

    def __init__(self, settings: FedCorrSettings, context: StrategyContext) -> None:
        super().__init__(settings, context)
        rounds = settings.stage3_rounds(context)
        self.stage3: FedAvg | None = None
        if rounds:
            self.stage3 = settings.stage3_class()(settings.stage3_settings(rounds=rounds), context.unbudgeted(),
                                                  stage=USUAL)
            self.stage3.log = self.log
        self.monitor: FedCorrMonitor | None = None
        self.stage = PREPROCESS
        self.iteration = 1
        self.mu_hat: dict[int, float] = {}
        self.cumulative: dict[int, float] = {}
        self.visits: dict[int, int] = {}  # stage-1 iterations each client trained in
        self.noisy: list[int] = []  # the clients the latest split flagged
        self.latest_lid: dict[int, float] = {}  # each client's LID of the last iteration it trained in
        self.latest_share: dict[int, float] = {}  # and its share score then (SHARE_SCORES)
        self.clean: list[int] = []
        self._chunks: list[list[int]] = []  # this iteration's rounds, in order
        self._next_chunk = 0
        self._iteration_start = 0  # the first round of the current stage-1 iteration
        self._lid: dict[int, float] = {}
        self._shares: dict[int, float] = {}
        self._finetune_left = 0
        self._grid: Grid | None = None

    def bind(self, federation: Federation) -> None:
        """Bind the federation here and in stage 3; every client starts with mu_hat = 0 and no LID."""
        super().bind(federation)
        if self.stage3 is not None:
            self.stage3.bind(federation)
        self.monitor = FedCorrMonitor(federation.partition_ids, self.context.truth, self.context.participation.late)
        self.mu_hat = dict.fromkeys(federation.partition_ids, 0.0)
        self.cumulative = dict.fromkeys(federation.partition_ids, 0.0)
        self.visits = dict.fromkeys(federation.partition_ids, 0)

    def summary(self) -> None:
        """Log FedCorr's settings."""
        log.info("FedCorr: %s", self.settings)

    def planned_rounds(self) -> int:
        """Stages 1 and 2, then stage 3's rounds."""
        return self.stages12_rounds() + (self.stage3.planned_rounds() if self.stage3 is not None else 0)

    def planned_clients(self, server_round: int) -> int:
        """m1 in stage 1; in stage 2 frac2 N, at most the clean clients (all clients until stage 1 has
        found them); stage 3's round size after."""
        num_clients = len(self.federation.partition_ids)
        if server_round <= self.stage1_ends()[-1]:
            return self.settings.stage1_round_size(num_clients)
        if server_round <= self.stages12_rounds():
            return min(round_size(self.settings.frac2, num_clients), len(self.clean) or num_clients)
        assert self.stage3 is not None  # only a stage 3 has rounds after stage 2
        return self.stage3.planned_clients(server_round)

    def result_blocks(self) -> dict[str, Any]:
        """Stage 3's blocks (if it runs) and FedCorr's detection and correction metrics."""
        assert self.monitor is not None
        blocks = self.stage3.result_blocks() if self.stage3 is not None else {}
        return {**blocks, "fedcorr": self.monitor.results()}

    def result_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """Stage 3's array files (if it runs) and the clients' confusion counts (``confusion.npz``)."""
        assert self.monitor is not None
        files = self.stage3.result_arrays() if self.stage3 is not None else {}
        return {**files, **self.monitor.arrays()}

    def stage1_ends(self) -> list[int]:
        """The last round of each stage-1 iteration, late joiners' included."""
        return self.settings.stage1_ends(len(self.federation.partition_ids), self.context.participation)

    def stages12_rounds(self) -> int:
        """The rounds of stages 1 and 2."""
        return self.settings.stages12_rounds(len(self.federation.partition_ids), self.context.participation)

    def stage_ends(self) -> list[int]:
        """The last rounds of stage 1 and of stage 2 (one round when there is no finetuning)."""
        return sorted({self.stage1_ends()[-1], self.stages12_rounds()})

    def skips_evaluation(self, server_round: int) -> bool:
        """With ``stage1_eval=iteration``, every stage-1 round but each iteration's last. With m1 = 1
        such a round's global model is one client's weights, never the run's best; skipping its
        evaluation saves a pass over the test split (docs/fedcorr.md, "Evaluation cadence")."""
        ends = self.stage1_ends()
        return self.settings.stage1_eval == "iteration" and server_round <= ends[-1] and server_round not in ends

    def state(self) -> dict[str, Any]:
        """FedCorr's own state, and stage 3's under ``stage3`` (None without a stage 3)."""
        return {**super().state(), "stage3": None if self.stage3 is None else self.stage3.state()}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state()``; its ``stage3`` part goes to stage 3, unless it is None (a run that
        takes another run's stages 1-2 gives none: its stage 3 starts fresh)."""
        own = dict(state)
        stage3 = own.pop("stage3")
        super().restore(own)
        if stage3 is not None and self.stage3 is not None:
            self.stage3.restore(stage3)

    @classmethod
    def extends(cls, settings: StrategySettings) -> bool:
        """Stages 1-2 do not depend on the budget, so whether stage 3 can extend its rounds."""
        assert isinstance(settings, FedCorrSettings)
        stage3 = not settings.ablation.usual_training or settings.stage3_class().extends(settings.stage3_settings())
        return super().extends(settings) and stage3

    def extend(self, state: dict[str, Any]) -> None:
        """Continue from the last checkpoint of the same config at a smaller budget: FedCorr's own
        state, and stage 3's with what the budget sizes computed anew."""
        self.restore({**state, "stage3": None})  # FedCorr's own: nothing in it depends on the budget
        if state["stage3"] is not None and self.stage3 is not None:
            self.stage3.extend(state["stage3"])

    def inherit(self, state: dict[str, Any]) -> None:
        """Take over another run's state at the end of its stage 2 (``stages12_from``): FedCorr's own,
        not its stage 3's."""
        self.restore({**state, "stage3": None})

    # --- Flower's round hooks ------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Close what the last round finished, then send the current stage's round: stage 1's next
        chunk of clients, a stage-2 sample of S_c, or stage 3's own round."""
        self._grid = grid
        self._settle(arrays)
        self.global_arrays = arrays
        if self.stage == USUAL and self.stage3 is not None:
            self.stage3.timeout = self.timeout  # its own queries (PoC's losses) wait as long as a round
            return self.stage3.configure_train(server_round, arrays, config, grid)
        if self.stage == PREPROCESS:
            if not self._chunks:
                clients = self._iteration_clients(server_round)
                order = [int(pid) for pid in self.rng.permutation(clients)]
                m1 = self.settings.stage1_round_size(len(self.federation.partition_ids))
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
        """Average the round's replies (stage 3: its own aggregation); stage 1 also keeps their LID scores.
        The joiners' own iteration leaves the global model as stage 1 ended: with one client a round it
        would become the last joiner's weights, fitted to its own labels, and those would relabel them."""
        if self.stage == USUAL and self.stage3 is not None:
            return self.stage3.aggregate_train(server_round, replies)
        if self.stage == PREPROCESS:
            good = self.collect(replies, self._read_stage1)
            self._lid.update({pid: reply.extra.lid for pid, reply in good.items()})
            self._shares.update({pid: reply.extra.loss_share for pid, reply in good.items()
                                 if reply.extra.loss_share is not None})
        else:
            good = self.collect(replies, self.read_train)
        joiners_own = self.stage == PREPROCESS and self.iteration > self.settings.t1
        assert self.global_arrays is not None
        arrays = self.global_arrays if joiners_own else average_arrays(good)
        train_loss = mean_train_loss(good)
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
        stage1 = Stage1Ins(lid_k=s.lid_k, keep_losses="local" in (s.split_losses, s.rank_losses),
                           loss_share=s.client_score == "loss_share", seed=self.context.seed)
        return instruction(TrainIns(server_round, training, plugin=PLUGIN), arrays=arrays,
                           plugin_ins=stage1, plugin=PLUGIN)

    def _iteration_clients(self, server_round: int) -> list[int]:
        """The clients of the stage-1 iteration starting at ``server_round``: those taking part; after
        the T1 iterations, the late joiners alone (their own pass, ``joiners=preprocess``)."""
        if self.iteration <= self.settings.t1:
            return self.present(server_round)
        return sorted(self.context.participation.late)

    def _read_stage1(self, content: RecordDict, sender: str) -> TrainReply:
        reply = self.read_train(content, sender)
        extra = read_extra(content, PLUGIN, LidRes, sender)
        if self.settings.client_score == "loss_share":
            share(extra.loss_share, sender, "loss-share")
        return TrainReply(reply.arrays, reply.result, extra)

    def _end_iteration(self, arrays: ArrayRecord) -> None:
        """Algorithm 1 lines 8-12: cumulative LID, the client split, noise estimates and relabelling.
        The joiners' own iteration splits them with everyone's scores and keeps the others' results."""
        assert self.monitor is not None
        for pid, value in self._lid.items():
            self.cumulative[pid] += value
            self.visits[pid] += 1
        if self.settings.client_score == "disagreement":
            self._shares = self._disagreements(arrays, sorted(self._lid))
        noisy = self._split_clients(self._client_scores())
        if self.iteration > self.settings.t1:
            noisy = [pid for pid in noisy if pid in self._lid]
            self.mu_hat.update(dict.fromkeys(self._lid, 0.0))
            corrected = self._correct(arrays, noisy, "stage1")
            noisy = sorted(set(self.noisy) | set(noisy))
        else:
            self.mu_hat = dict.fromkeys(self.mu_hat, 0.0)
            corrected = self._correct(arrays, noisy, "stage1")
        self.mu_hat.update({pid: float(res.mu_hat) for pid, res in corrected.items() if res.mu_hat is not None})
        scores = {self.settings.client_score: self._shares} if self._shares else {}
        self.monitor.end_iteration(self.iteration, self._lid, self.cumulative, noisy, self.mu_hat, scores)
        self.noisy = noisy
        self.iteration += 1
        self.latest_lid = {**self.latest_lid, **self._lid}
        self.latest_share = {**self.latest_share, **self._shares}
        self._chunks, self._next_chunk, self._lid, self._shares = [], 0, {}, {}

    def _client_scores(self) -> dict[int, float]:
        """What the split reads, for every client that has trained in stage 1 (``client_score``); the
        joiners' own iteration reads the others' last iteration's LID beside theirs."""
        own_pass = self.iteration > self.settings.t1
        if self.settings.client_score == "iteration":
            return {**self.latest_lid, **self._lid} if own_pass else self._lid
        if self.settings.client_score in SHARE_SCORES:
            return {**self.latest_share, **self._shares} if own_pass else self._shares
        visited = [pid for pid in self.federation.partition_ids if self.visits[pid]]
        if self.settings.client_score == "mean":
            return {pid: self.cumulative[pid] / self.visits[pid] for pid in visited}
        return {pid: self.cumulative[pid] for pid in visited}

    def _disagreements(self, arrays: ArrayRecord, clients: list[int]) -> dict[int, float]:
        """``query.loss`` with the iteration's global model on ``clients``: the share of each one's labels
        (as it holds them now) that the model's prediction differs from."""
        assert self._grid is not None

        def read(reply: RecordDict, sender: str) -> float:
            return 1.0 - share(read_reply(reply, Scores, sender).accuracy, sender, "accuracy")

        return self.exchange(self._grid, dict.fromkeys(clients, instruction(arrays=arrays)), LOSS, read)

    def _split_clients(self, scores: Mapping[int, float]) -> list[int]:
        """The clients in the higher-mean GMM component of their scores (none when the guard, if
        any, finds one population); with ``client_components=bic``, those outside the lowest component."""
        pids = sorted(scores)
        guard, values = self.settings.client_split_guard, np.array([scores[pid] for pid in pids])
        if self.settings.client_components == "bic":
            flagged = above_lowest(values, seed=self.context.seed)
        else:
            flagged = high_component(values, seed=self.context.seed, guard=guard)
        if guard != "none" and not flagged.any():
            log.info("FedCorr: the %s guard finds one population in the clients' %s scores; no client is flagged",
                     guard, self.settings.client_score)
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
        self.stage = USUAL if self.stage3 is not None else DONE

    # --- shared --------------------------------------------------------------------------------

    def _settle(self, arrays: ArrayRecord) -> None:
        """Close whatever the rounds so far finished: an iteration, stage 1, stage 2 (in that order)."""
        if self.stage == PREPROCESS and self._chunks and self._next_chunk == len(self._chunks):
            self._end_iteration(arrays)
            if self.iteration > len(self.stage1_ends()):
                self._start_finetuning()
        if self.stage == FINETUNE and self._finetune_left == 0:
            self._end_finetuning(arrays)

    def _correct(self, arrays: ArrayRecord, clients: list[int], mode: str) -> dict[int, CorrectRes]:
        """``query.correct`` on ``clients``; returns their replies by partition id."""
        if not clients:
            return {}
        assert self._grid is not None
        assert self.monitor is not None
        s = self.settings
        ins = CorrectIns(mode=mode, pi=s.pi, theta=s.theta, relabel=s.ablation.correction,
                         split_losses=s.split_losses, rank_losses=s.rank_losses,
                         losses_since=self._iteration_start, seed=self.context.seed,
                         diagnostics=self.context.truth is not None, stage2_rows=s.stage2_rows,
                         stage2_keep=s.stage2_keep)
        content = instruction(ins, arrays=arrays)

        def read(reply: RecordDict, sender: str) -> CorrectRes:
            res = read_reply(reply, CorrectRes, sender)
            if mode == "stage1" and res.mu_hat is None:
                raise ProtocolError(sender, "mu-hat", "is missing from a stage-1 correction")
            return res

        replies = self.exchange(self._grid, {pid: content for pid in clients}, CORRECT, read)
        self.monitor.corrected(replies, mode)
        return replies
