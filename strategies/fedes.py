"""FedES (Zeng et al., IJCAI 2024): federated early-stopping of non-critical parameters.

Rounds 1..s1 (``pretrain``): FedAvg with local cross-entropy. Round s1 + 1 (``estimate``): every
client trains the same way (full participation) and the round is averaged as in
FedAvg; from the clients' weights the server estimates each client's quality rho_n
(``strategies.fedes_quality``). The remaining rounds (``segd``): a sample of clients trains with
selective gradient descent at its own rho_n (client side: ``client/methods/fedes.py``), and the
server aggregates with NaAgg, weights n_k * rho_k; with ``reestimate_every = r`` every r-th round
after the first estimation is another estimation round. ``docs/fedes.md`` maps the method to
this code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from common.errors import InvalidValue
from common.validation import Flag, Interval, Options, option
from protocol.fedes import MASK_SOURCES, PLUGIN, SeGdIns
from protocol.messages import TRAIN, instruction
from strategies.aggregation import as_numpy, as_record, weighted_average
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.detection import detection_block, mean_abs_error, mean_squared_error
from strategies.fedavg import FedAvg, average_arrays, client_states, example_counts
from strategies.fedes_quality import MU_ESTIMATORS, QualityEstimate, estimate_quality, parameter_set
from strategies.rounds import RoundSettings
from task.critical_parameters import PARAMETER_SETS

log = logging.getLogger(__name__)

PRETRAIN, ESTIMATE, SEGD = "pretrain", "estimate", "segd"
# naagg: weights n_k * rho_k (the slides) | fedavg: weights n_k (the released code).
AGGREGATIONS = ("naagg", "fedavg")
# estimate: the signed-EMD estimate (the slides) | oracle: 1 - the true noise rate (the released
# code; reads the scene's ground truth, so diagnostics only).
RHO_SOURCES = ("estimate", "oracle")
# FedES makes no binary decision; for a detection score comparable with FedCorr's, a client whose
# estimated rho is below this counts as detected noisy (our reading).
DETECTION_THRESHOLD = 0.5
# W_start of a client's CoP: the global model it started from (``global``), or its own upload of
# the round before the estimation round (``own_upload``; the global model for a client that was not
# in that round).
COP_ORIGINS = ("global", "own_upload")


def phase_of(server_round: int, s1: int, reestimate_every: int | None) -> str:
    """The stage of ``server_round``: pretrain up to s1, estimate at s1 + 1 (and every
    ``reestimate_every`` rounds after it), segd otherwise."""
    if server_round <= s1:
        return PRETRAIN
    since = server_round - (s1 + 1)
    return ESTIMATE if since == 0 or (reestimate_every and since % reestimate_every == 0) else SEGD


@dataclass(frozen=True)
class FedESSettings(RoundSettings):
    """FedAvg's schedule (``num_rounds`` counts every round, the estimation round included; a
    ``comm_budget`` replaces it) and FedES's options (``conf/strategy/fedes.yaml``); its learner must
    be ``ce``."""

    s1: int = option(Interval(int, 0), "pre-training rounds; the estimation round is s1 + 1 (< num_rounds)")
    aggregation: str = option(Options(AGGREGATIONS), "naagg (weights n_k * rho_k) | fedavg (weights n_k)")
    rho_source: str = option(Options(RHO_SOURCES), "estimate (signed EMD) | oracle (1 - true noise; needs "
                                                   "ground truth)")
    mu: str = option(Options(MU_ESTIMATORS), "the CoP summary: gmm | arithmetic_mean")
    rho_floor: float = option(Interval(float, 0.0, 1.0), "the least rho a client gets")
    mask_params: str = option(Options(PARAMETER_SETS), "the parameter set P: weights | all")
    strict_freeze: bool = option(Flag(), "also keep masked weights still through momentum and weight decay")
    mask: str = option(Options(MASK_SOURCES), "dynamic (top |grad * weight| every step) | static")
    cop_origin: str = option(Options(COP_ORIGINS), "W_start of a client's CoP: global | own_upload")
    # 1 would make every later round an estimation round: no SeGD at all.
    reestimate_every: int | None = option(Interval(int, 2, or_none=True),
                                          "null estimates rho once; r: every r-th round after it estimates again")

    def check(self) -> None:
        """The estimation round must be one of the run's rounds, and FedES trains with cross-entropy."""
        if self.s1 >= self.num_rounds:
            raise InvalidValue("s1", self.s1, f"allowed is an integer >= 0 and < num_rounds ({self.num_rounds}): "
                                              "the estimation round s1 + 1 must be one of the run's rounds")
        if self.train.learner != "ce":
            raise InvalidValue("train.learner", self.train.learner,
                               "allowed is ce: FedES pre-trains, estimates and runs SeGD with cross-entropy")

    def check_run(self, context: StrategyContext) -> None:
        """The round size must fit, the budget pay for pre-training and estimation, and the oracle
        needs ground truth."""
        self.check_round_size(context)
        self.total_rounds(context.num_clients, context.comm_budget)
        if self.rho_source == "oracle" and not context.ground_truth:
            raise InvalidValue("rho_source", self.rho_source,
                               "allowed is estimate without ground truth: oracle reads the scene's true noise")

    def total_rounds(self, num_clients: int, comm_budget: int | None) -> int:
        """All rounds: ``num_rounds``, or with a budget s1 + 1 + the later rounds that the pre-training
        (s1 rounds of m) and the estimation round (all N clients) leave, each re-estimation round
        costing N and each SeGD round m."""
        if comm_budget is None:
            return self.num_rounds
        size = self.round_size(num_clients)
        spent = self.s1 * size + num_clients
        # Refuses, in the one wording, a budget that cannot pay for pre-training and estimation.
        self.rounds_under(comm_budget, num_clients, spent, "FedES's pre-training and estimation rounds")
        last = self.s1 + 1
        while True:
            cost = num_clients if phase_of(last + 1, self.s1, self.reestimate_every) == ESTIMATE else size
            if spent + cost > comm_budget:
                return last
            spent, last = spent + cost, last + 1


def naagg_weights(sizes: Sequence[float], rhos: Sequence[float]) -> list[float] | None:
    """NaAgg's weights n_k * rho_k (``weighted_average`` normalises them); None when they sum to 0."""
    weights = [float(n) * float(rho) for n, rho in zip(sizes, rhos)]
    return weights if sum(weights) > 0 else None


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two paired samples (None when either is constant or too short)."""
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    from scipy.stats import spearmanr  # lazy: scikit-learn's dependency, slow to import

    return float(spearmanr(a, b).statistic)


class FedES(FedAvg):
    """FedES's three phases in the round loop; the model's trainable parameters
    (``context.parameter_names``) are where P is chosen, the run's seed seeds the GMM, and the
    scene's ground truth gives the oracle and the quality figures."""

    name = "fedes"
    late_joiners = False  # it queries every client in some rounds
    settings: FedESSettings
    stage3 = False
    needs_parameter_names = True

    def __init__(self, settings: FedESSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage or PRETRAIN)
        self.num_rounds = settings.total_rounds(context.num_clients, context.comm_budget)
        self.estimate: QualityEstimate | None = None
        self.estimated_at: int | None = None
        self.estimation_rounds: list[int] = []
        self.previous_uploads: dict[int, dict[str, np.ndarray]] = {}  # cop_origin=own_upload only
        self.rho_sent: dict[int, float] = {}  # what SeGD and NaAgg use, per client
        self.naagg_fallbacks = 0
        self._round = 0

    def node_state(self) -> bool:
        """With the static mask its clients keep their update's CoP from the estimation round."""
        return self.settings.mask == "static"

    def summary(self) -> None:
        """Log the three phases' rounds and the switches."""
        log.info("FedES: %d rounds in all; %s", self.num_rounds, self.settings)

    def stage_ends(self) -> list[int]:
        """The last pre-training round and the (first) estimation round."""
        return [s for s in (self.settings.s1, self.settings.s1 + 1) if s < self.num_rounds]

    def phase(self, server_round: int) -> str:
        """The stage of ``server_round`` (``phase_of``)."""
        return phase_of(server_round, self.settings.s1, self.settings.reestimate_every)

    def segd_ins(self, rho: float) -> SeGdIns:
        """What a client trains with at ``rho``."""
        s = self.settings
        return SeGdIns(rho=rho, mask_params=s.mask_params, strict_freeze=s.strict_freeze, mask=s.mask)

    def rho_of(self, pid: int) -> float:
        """The rho client ``pid`` trains and is weighted with (1 for a client never estimated)."""
        return self.rho_sent.get(pid, 1.0)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Pre-training: FedAvg's sample; estimation: every client; SeGD: FedAvg's sample, each with its rho."""
        self._round, self.stage, self.global_arrays = server_round, self.phase(server_round), arrays
        ins = self.train_instruction(server_round)
        if self.stage == ESTIMATE:
            # Plain training; with the static mask every client also keeps its update's CoP.
            content = (instruction(replace(ins, plugin=PLUGIN), arrays=arrays, plugin=PLUGIN,
                                   plugin_ins=replace(self.segd_ins(1.0), keep_cop=True))
                       if self.settings.mask == "static" else instruction(ins, arrays=arrays))
            return self.messages(dict.fromkeys(self.federation.partition_ids, content), TRAIN)
        chosen = self.select(server_round, arrays, grid)
        if self.stage == PRETRAIN:
            content = instruction(ins, arrays=arrays)
            return self.messages(dict.fromkeys(chosen, content), TRAIN)
        segd = replace(ins, plugin=PLUGIN)
        return self.messages({pid: instruction(segd, arrays=arrays, plugin=PLUGIN,
                                               plugin_ins=self.segd_ins(self.rho_of(pid)))
                              for pid in chosen}, TRAIN)

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedAvg, estimating rho after an estimation round; NaAgg in the SeGD rounds."""
        if self.settings.cop_origin == "own_upload" and self.phase(self._round + 1) == ESTIMATE:
            # The other reading of W_start: the next estimation measures each update from the client's own upload now.
            self.previous_uploads = {pid: as_numpy(reply.arrays) for pid, reply in replies.items()}
        if self.stage == SEGD and self.settings.aggregation == "naagg":
            weights = naagg_weights(example_counts(replies), [self.rho_of(pid) for pid in replies])
            if weights is not None:
                return as_record(weighted_average(client_states(replies), weights))
            self.naagg_fallbacks += 1
            log.warning("FedES round %d: every client of the round has rho 0 (clients %s); NaAgg falls back "
                        "to FedAvg", self._round, sorted(replies))
        arrays = average_arrays(replies)
        if self.stage == ESTIMATE:
            self._estimate(replies, arrays)
        return arrays

    def _estimate(self, replies: Mapping[int, TrainReply], aggregate: ArrayRecord) -> None:
        """Estimate the rho of every client that answered the estimation round, from its weights
        (W_start: the global model it started from, or its own upload of the round before)."""
        assert self.global_arrays is not None
        start = as_numpy(self.global_arrays)
        names = parameter_set(start, self.context.parameter_names, self.settings.mask_params)
        self.estimate = estimate_quality(
            start, {pid: as_numpy(reply.arrays) for pid, reply in replies.items()}, as_numpy(aggregate), names,
            estimator=self.settings.mu, seed=self.context.seed, floor=self.settings.rho_floor,
            client_starts=self.previous_uploads if self.settings.cop_origin == "own_upload" else None)
        self.previous_uploads = {}
        self.estimated_at = self._round
        self.estimation_rounds.append(self._round)
        self.rho_sent = self._oracle() if self.settings.rho_source == "oracle" else dict(self.estimate.rho)
        missing = sorted(set(self.federation.partition_ids) - set(replies))
        if missing:
            log.warning("FedES: clients %s did not answer the estimation round; they train with rho = 1", missing)
        rho = self.estimate.rho
        line = (f"[fedes] rho estimated at round {self._round}: rho in "
                f"[{min(rho.values()):.3f}, {max(rho.values()):.3f}]")
        mse = self._quality_figures().get("quality_mse")
        if mse is not None:
            line += f"; MSE vs true quality {mse:.4f}"
        print(line, flush=True)

    def _oracle(self) -> dict[int, float]:
        """1 - each client's true noise rate (1 where unknown): the released code's mask size."""
        assert self.context.truth is not None
        return {pid: 1.0 - noise if np.isfinite(noise) else 1.0 for pid, noise in self.context.truth.true_noise.items()}

    def _true_quality(self) -> dict[int, float]:
        assert self.context.truth is not None
        return {pid: 1.0 - noise for pid, noise in self.context.truth.true_noise.items()}

    def _quality_figures(self) -> dict[str, Any]:
        """The estimate against the true quality q = 1 - true noise: Table 4's MSE, the MAE and
        Spearman's rank correlation (empty without ground truth or before the estimate)."""
        if self.context.truth is None or self.estimate is None:
            return {}
        rho, quality = self.estimate.rho, self._true_quality()
        known = [pid for pid in rho if np.isfinite(quality.get(pid, np.nan))]
        return {
            "quality_mse": mean_squared_error(rho, quality),
            "quality_mae": mean_abs_error(rho, quality),
            "quality_spearman": spearman([rho[pid] for pid in known], [quality[pid] for pid in known]),
        }

    def client_rows(self) -> list[dict[str, Any]]:
        """One row per client for fedes_clients.csv: d, mu, the estimated and the sent rho, the true quality."""
        if self.estimate is None:
            return []
        quality = self._true_quality() if self.context.truth is not None else {}
        return [{"client": pid, "distance": self.estimate.distance.get(pid), "mu": self.estimate.mu.get(pid),
                 "rho": self.estimate.rho.get(pid), "rho_sent": self.rho_of(pid), "true_quality": quality.get(pid)}
                for pid in self.federation.partition_ids]

    def result_blocks(self) -> dict[str, Any]:
        """The ``fedes`` block of results.json: the estimate per client, what stage 2 used and, with
        ground truth, the estimate against the true quality and a detection score at rho < 0.5."""
        estimate = self.estimate
        block: dict[str, Any] = {
            "estimated_at": self.estimated_at,
            "estimation_rounds": self.estimation_rounds,
            "mask": self.settings.mask,
            "cop_origin": self.settings.cop_origin,
            "rho_source": self.settings.rho_source,
            "aggregation": self.settings.aggregation,
            "naagg_fallbacks": self.naagg_fallbacks,
            "mu_global": None if estimate is None else estimate.mu_global,
            "rho": {} if estimate is None else {str(k): v for k, v in sorted(estimate.rho.items())},
            "rho_sent": {str(k): v for k, v in sorted(self.rho_sent.items())},
            "distance": {} if estimate is None else {str(k): v for k, v in sorted(estimate.distance.items())},
            "mu": {} if estimate is None else {str(k): v for k, v in sorted(estimate.mu.items())},
            "clients": self.client_rows(),
        }
        if self.context.truth is not None:
            block["true_quality"] = {str(k): v for k, v in sorted(self._true_quality().items())}
            block.update(self._quality_figures())
        if estimate is not None:
            block["detection_threshold"] = DETECTION_THRESHOLD
            block.update(detection_block([pid for pid, rho in estimate.rho.items() if rho < DETECTION_THRESHOLD],
                                         self.context.truth))
        return {"fedes": block}
