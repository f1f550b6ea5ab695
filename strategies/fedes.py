"""FedES (Zeng et al., IJCAI 2024): federated early-stopping of non-critical parameters.

Rounds 1..s1 (``pretrain``): FedAvg with local cross-entropy. Round s1 + 1 (``estimate``): every
client trains the same way (full participation, methods.md 4.6 D9) and the round is averaged as in
FedAvg; from the clients' weights the server estimates each client's quality rho_n
(``strategies.fedes_quality``). The remaining rounds (``segd``): a sample of clients trains with
selective gradient descent at its own rho_n (client side: ``client/methods/fedes.py``), and the
server aggregates with NaAgg, weights n_k * rho_k; with ``reestimate_every = r`` every r-th round
after the first estimation is another estimation round (D8). ``docs/fedes.md`` maps the method to
this code.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from common.errors import ConfigError, InvalidValue
from common.validation import Choice, Flag, Integer, Nullable, Number, check_fields, rule, settings_from_mapping
from protocol.fedes import MASK_SOURCES, METHOD, SeGdOptions
from protocol.messages import TRAIN, instruction
from strategies.aggregation import as_numpy, as_record, weighted_average
from strategies.base import TrainReply
from strategies.detection import detection_block, mean_abs_error, mean_squared_error
from strategies.environment import Environment
from strategies.fedavg import FedAvg, average_arrays, client_states, example_counts
from strategies.fedes_quality import MU_ESTIMATORS, QualityEstimate, estimate_quality, parameter_set
from strategies.ground_truth import GroundTruth
from strategies.registry import StrategyEntry, parse_training
from strategies.rounds import RoundSettings
from task.critical_parameters import PARAMETER_SETS
from task.local_training import LocalTraining

log = logging.getLogger(__name__)

PRETRAIN, ESTIMATE, SEGD = "pretrain", "estimate", "segd"
# naagg: weights n_k * rho_k (the slides) | fedavg: weights n_k (the released code, D1).
AGGREGATIONS = ("naagg", "fedavg")
# estimate: the signed-EMD estimate (the slides) | oracle: 1 - the true noise rate (the released
# code; reads the scene's ground truth, so diagnostics only, D1).
RHO_SOURCES = ("estimate", "oracle")
# FedES makes no binary decision; for a detection score comparable with FedCorr's, a client whose
# estimated rho is below this counts as detected noisy (our reading).
DETECTION_THRESHOLD = 0.5
# W_start of a client's CoP (D2): the global model it started from (``global``), or its own upload of
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
class FedESSettings:
    """FedES's settings (``conf/strategy/fedes.yaml``; methods.md 4.4 and 4.6).

    train: the local SGD settings of every round; its learner must be ``ce``.
    num_rounds: all training rounds, the estimation round included (a ``comm_budget`` replaces it).
    fraction, min_clients: the share of clients per pre-training and SeGD round, and its minimum.
    s1: pre-training rounds; the estimation round is s1 + 1, so s1 < num_rounds.
    aggregation: ``naagg`` | ``fedavg`` (D1). rho_source: ``estimate`` | ``oracle`` (D1).
    mu: the CoP summary, ``gmm`` | ``arithmetic_mean`` (D3). rho_floor: the least rho a client gets (D6).
    mask_params: the parameter set P, ``weights`` | ``all`` (D5). strict_freeze: SeGD's D7 switch.
    mask: ``dynamic`` | ``static`` (D4). cop_origin: ``global`` | ``own_upload`` (D2).
    reestimate_every: None estimates rho once; r: every r-th round after it is another estimation
        round (D8).
    """

    train: LocalTraining
    num_rounds: int = field(metadata=rule(Integer(low=1)))
    fraction: float = field(metadata=rule(Number(low=0.0, high=1.0, low_open=True)))
    s1: int = field(metadata=rule(Integer(low=0)))
    min_clients: int = field(default=1, metadata=rule(Integer(low=1)))
    aggregation: str = field(default="naagg", metadata=rule(Choice(AGGREGATIONS)))
    rho_source: str = field(default="estimate", metadata=rule(Choice(RHO_SOURCES)))
    mu: str = field(default="gmm", metadata=rule(Choice(MU_ESTIMATORS)))
    rho_floor: float = field(default=0.0, metadata=rule(Number(low=0.0, high=1.0)))
    mask_params: str = field(default="weights", metadata=rule(Choice(PARAMETER_SETS)))
    strict_freeze: bool = field(default=False, metadata=rule(Flag()))
    mask: str = field(default="dynamic", metadata=rule(Choice(MASK_SOURCES)))
    cop_origin: str = field(default="global", metadata=rule(Choice(COP_ORIGINS)))
    # 1 would make every later round an estimation round: no SeGD at all.
    reestimate_every: int | None = field(default=None, metadata=rule(Nullable(Integer(low=2))))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.s1 >= self.num_rounds:
            raise InvalidValue("s1", self.s1, f"allowed is an integer >= 0 and < num_rounds ({self.num_rounds}): "
                                              "the estimation round s1 + 1 must be one of the run's rounds")
        if self.train.learner != "ce":
            raise InvalidValue("train.learner", self.train.learner,
                               "allowed is ce: FedES pre-trains, estimates and runs SeGD with cross-entropy")

    @property
    def rounds(self) -> RoundSettings:
        """The schedule of the pre-training and SeGD rounds."""
        return RoundSettings(train=self.train, num_rounds=self.num_rounds, fraction=self.fraction,
                             min_clients=self.min_clients)

    def total_rounds(self, num_clients: int, comm_budget: int | None) -> int:
        """All rounds: ``num_rounds``, or with a budget s1 + 1 + the later rounds that the pre-training
        (s1 rounds of m) and the estimation round (all N clients) leave, each re-estimation round
        costing N and each SeGD round m."""
        rounds = self.rounds
        if comm_budget is None:
            return self.num_rounds
        size = rounds.round_size(num_clients)
        spent = self.s1 * size + num_clients
        # Refuses, in the one wording, a budget that cannot pay for pre-training and estimation.
        rounds.rounds_under(comm_budget, num_clients, spent, "FedES's pre-training and estimation rounds")
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
    """FedES's three phases in Flower's round loop.

    s1: pre-training rounds (the estimation round is s1 + 1; ``num_rounds`` counts every round).
    parameter_names: the model's trainable parameters (P is chosen among them).
    seed: the run's seed (the GMM's random_state and its subsample).
    truth: the scene's ground truth (the oracle and the quality figures); None without.
    aggregation, rho_source, mu, rho_floor, mask_params, strict_freeze, mask, cop_origin,
    reestimate_every: see ``FedESSettings``.
    Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, s1: int, parameter_names: Collection[str], seed: int, truth: GroundTruth | None = None,
                 aggregation: str = "naagg", rho_source: str = "estimate", mu: str = "gmm", rho_floor: float = 0.0,
                 mask_params: str = "weights", strict_freeze: bool = False, mask: str = "dynamic",
                 cop_origin: str = "global", reestimate_every: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not parameter_names:
            raise ConfigError("FedES needs the model's parameter names; none were given")
        if rho_source == "oracle" and truth is None:
            raise InvalidValue("strategy.rho_source", rho_source,
                               "allowed is estimate without ground truth: oracle reads the scene's true noise")
        self.s1 = s1
        self.parameter_names = tuple(parameter_names)
        self.seed = seed
        self.truth = truth
        self.aggregation = aggregation
        self.rho_source = rho_source
        self.mu = mu
        self.rho_floor = rho_floor
        self.mask_params = mask_params
        self.strict_freeze = strict_freeze
        self.mask = mask
        self.cop_origin = cop_origin
        self.reestimate_every = reestimate_every
        self.estimate: QualityEstimate | None = None
        self.estimated_at: int | None = None
        self.estimation_rounds: list[int] = []
        self.previous_uploads: dict[int, dict[str, np.ndarray]] = {}  # cop_origin=own_upload only
        self.rho_sent: dict[int, float] = {}  # what SeGD and NaAgg use, per client
        self.naagg_fallbacks = 0
        self._round = 0

    def summary(self) -> None:
        """Log the three phases' rounds and the switches."""
        log.info("FedES: %d pre-training rounds, estimation at round %d (again every %s rounds), %d rounds in "
                 "all; fraction=%s, aggregation=%s, rho_source=%s, mu=%s, rho_floor=%s, mask_params=%s, "
                 "strict_freeze=%s, mask=%s, cop_origin=%s, train=%s", self.s1, self.s1 + 1, self.reestimate_every,
                 self.num_rounds, self.fraction, self.aggregation, self.rho_source, self.mu, self.rho_floor,
                 self.mask_params, self.strict_freeze, self.mask, self.cop_origin, self.train)

    def phase(self, server_round: int) -> str:
        """The stage of ``server_round`` (``phase_of``)."""
        return phase_of(server_round, self.s1, self.reestimate_every)

    def segd_options(self, rho: float) -> SeGdOptions:
        """What a client trains with at ``rho``."""
        return SeGdOptions(rho=rho, mask_params=self.mask_params, strict_freeze=self.strict_freeze, mask=self.mask)

    def rho_of(self, pid: int) -> float:
        """The rho client ``pid`` trains and is weighted with (1 for a client never estimated, D9)."""
        return self.rho_sent.get(pid, 1.0)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Pre-training: FedAvg's sample; estimation: every client; SeGD: FedAvg's sample, each with its rho."""
        self._round, self.stage, self.global_arrays = server_round, self.phase(server_round), arrays
        ins = self.train_instruction(server_round)
        if self.stage == ESTIMATE:
            # Plain training; with the static mask every client also keeps its update's CoP.
            content = (instruction(replace(ins, method=METHOD), arrays=arrays, method=METHOD,
                                   options=replace(self.segd_options(1.0), keep_cop=True))
                       if self.mask == "static" else instruction(ins, arrays=arrays))
            return self.messages(dict.fromkeys(self.federation.partition_ids, content), TRAIN)
        chosen = self.select(server_round, arrays, grid)
        if self.stage == PRETRAIN:
            content = instruction(ins, arrays=arrays)
            return self.messages(dict.fromkeys(chosen, content), TRAIN)
        segd = replace(ins, method=METHOD)
        return self.messages({pid: instruction(segd, arrays=arrays, method=METHOD,
                                               options=self.segd_options(self.rho_of(pid)))
                              for pid in chosen}, TRAIN)

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedAvg, estimating rho after an estimation round; NaAgg in the SeGD rounds."""
        if self.cop_origin == "own_upload" and self.phase(self._round + 1) == ESTIMATE:
            # D2's other reading: the next estimation measures each update from the client's own upload now.
            self.previous_uploads = {pid: as_numpy(reply.arrays) for pid, reply in replies.items()}
        if self.stage == SEGD and self.aggregation == "naagg":
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
        (W_start: the global model it started from, or its own upload of the round before, D2)."""
        assert self.global_arrays is not None
        start = as_numpy(self.global_arrays)
        names = parameter_set(start, self.parameter_names, self.mask_params)
        self.estimate = estimate_quality(
            start, {pid: as_numpy(reply.arrays) for pid, reply in replies.items()}, as_numpy(aggregate), names,
            estimator=self.mu, seed=self.seed, floor=self.rho_floor,
            client_starts=self.previous_uploads if self.cop_origin == "own_upload" else None)
        self.previous_uploads = {}
        self.estimated_at = self._round
        self.estimation_rounds.append(self._round)
        self.rho_sent = self._oracle() if self.rho_source == "oracle" else dict(self.estimate.rho)
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
        assert self.truth is not None
        return {pid: 1.0 - noise if np.isfinite(noise) else 1.0 for pid, noise in self.truth.true_noise.items()}

    def _true_quality(self) -> dict[int, float]:
        assert self.truth is not None
        return {pid: 1.0 - noise for pid, noise in self.truth.true_noise.items()}

    def _quality_figures(self) -> dict[str, Any]:
        """The estimate against the true quality q = 1 - true noise: Table 4's MSE, the MAE and
        Spearman's rank correlation (empty without ground truth or before the estimate)."""
        if self.truth is None or self.estimate is None:
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
        quality = self._true_quality() if self.truth is not None else {}
        return [{"client": pid, "distance": self.estimate.distance.get(pid), "mu": self.estimate.mu.get(pid),
                 "rho": self.estimate.rho.get(pid), "rho_sent": self.rho_of(pid), "true_quality": quality.get(pid)}
                for pid in self.federation.partition_ids]

    def extra_results(self) -> dict[str, Any]:
        """The ``fedes`` block of results.json: the estimate per client, what stage 2 used and, with
        ground truth, the estimate against the true quality and a detection score at rho < 0.5."""
        estimate = self.estimate
        block: dict[str, Any] = {
            "estimated_at": self.estimated_at,
            "estimation_rounds": self.estimation_rounds,
            "mask": self.mask,
            "cop_origin": self.cop_origin,
            "rho_source": self.rho_source,
            "aggregation": self.aggregation,
            "naagg_fallbacks": self.naagg_fallbacks,
            "mu_global": None if estimate is None else estimate.mu_global,
            "rho": {} if estimate is None else {str(k): v for k, v in sorted(estimate.rho.items())},
            "rho_sent": {str(k): v for k, v in sorted(self.rho_sent.items())},
            "distance": {} if estimate is None else {str(k): v for k, v in sorted(estimate.distance.items())},
            "mu": {} if estimate is None else {str(k): v for k, v in sorted(estimate.mu.items())},
            "clients": self.client_rows(),
        }
        if self.truth is not None:
            block["true_quality"] = {str(k): v for k, v in sorted(self._true_quality().items())}
            block.update(self._quality_figures())
        if estimate is not None:
            block["detection_threshold"] = DETECTION_THRESHOLD
            block.update(detection_block([pid for pid, rho in estimate.rho.items() if rho < DETECTION_THRESHOLD],
                                         self.truth))
        return {"fedes": block}


def _parse(cfg: Mapping[str, Any], prefix: str) -> FedESSettings:
    return settings_from_mapping(FedESSettings, cfg, prefix, train=parse_training(cfg, prefix))


def _check(settings: FedESSettings, env: Environment) -> None:
    settings.rounds.check_for(env.num_clients, None, "strategy")
    settings.total_rounds(env.num_clients, env.comm_budget)
    if settings.rho_source == "oracle" and not env.ground_truth:
        raise InvalidValue("strategy.rho_source", settings.rho_source,
                           "allowed is estimate without ground truth: oracle reads the scene's true noise")


def _build(settings: FedESSettings, env: Environment, rng: np.random.Generator) -> FedES:
    return FedES(num_rounds=settings.total_rounds(env.num_clients, env.comm_budget), fraction=settings.fraction,
                 min_clients=settings.min_clients, train=settings.train, stage=PRETRAIN, rng=rng,
                 skip_failed=env.skip_failed, s1=settings.s1, parameter_names=env.parameter_names, seed=env.seed,
                 truth=env.truth, aggregation=settings.aggregation, rho_source=settings.rho_source, mu=settings.mu,
                 rho_floor=settings.rho_floor, mask_params=settings.mask_params,
                 strict_freeze=settings.strict_freeze, mask=settings.mask, cop_origin=settings.cop_origin,
                 reestimate_every=settings.reestimate_every)


STRATEGY = StrategyEntry("fedes", _parse, _check, _build)
