"""FedNoRo (Wu et al., IJCAI 2023): warm-up, noisy-client
detection, then distillation on noisy clients and distance-aware aggregation.

Warm-up (the first T1 rounds): FedAvg, every client trains with the logit-adjusted loss.
Detection (once, before round T1 + 1): every client, sampled or not, answers ``query.class_loss``
with the warmed-up global model's per-class mean loss on its given labels and which classes it has
(a mask; per-class counts with ``detect_counts``, read as the same mask); the server votes a
2-component mixture over them (``strategies.fednoro_detection``): S_n, the noisy clients. With
``redetect_every = r`` the detection is repeated every r rounds after it and S_n replaced.
Then each round clean clients keep the logit-adjusted loss and noisy ones add distillation from
the global model with weight lambda_t = a exp(-5 (1 - (clip(t, b, e) - b) / (e - b))^2), b = T1; the
server aggregates with DaAgg: w_i proportional to n_i exp(-D(i)), D(i) the distance of a noisy
client's weights to the nearest clean participant's, divided by the round's largest (0 for clean
clients). A round whose participants are all clean or all noisy is plain FedAvg (FNBench's rule
for partial participation).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from common.errors import InvalidValue
from common.seeding import rng_for
from common.text import counted
from common.validation import Flag, Interval, Options, option
from protocol.codec import ProtocolError
from protocol.fednoro import (
    ABSENT_CLASSES,
    CLASS_LOSS,
    DETECT_TRANSFORMS,
    PLUGIN,
    ClassLossIns,
    ClassLossRes,
    FedNoRoIns,
)
from protocol.messages import instruction, read_reply
from strategies.aggregation import as_record, weighted_average
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.detection import detection_block
from strategies.fedavg import FedAvg, client_states, example_counts
from strategies.fednoro_detection import normalised_class_losses, voted_noisy_rows
from strategies.rounds import RoundSettings

log = logging.getLogger(__name__)

WARMUP, DISTILL = "warmup", "distill"
# Where lambda's ramp ends: ``half`` e = floor(R/2) - 1 (the released code's 49 of 100 rounds), ``end``
# e = R (FNBench).
RAMP_ENDS = ("half", "end")
# The distance between two clients' weights: ``per_tensor`` sums each tensor's Frobenius norm (the
# released code); ``global_l2`` is the norm of all weights as one vector (the slides' ||w_i - w_j||).
DISTANCES = ("per_tensor", "global_l2")


@dataclass(frozen=True)
class FedNoRoSettings(RoundSettings):
    """FedAvg's schedule and FedNoRo's options (``conf/strategy/options/fednoro.yaml``)."""

    warmup: int | None = option(Interval(int, 1, or_none=True),
                                "T1, the warm-up rounds before detection (null: a tenth of the rounds, at least 1)")
    kd_weight: float = option(Interval(float, 0.0, 1.0), "a, the ceiling of the distillation weight lambda")
    kd_temperature: float = option(Interval(float, 0.0, closed="neither"), "T, the teacher's softmax temperature")
    la_tau: float = option(Interval(float, 0.0), "tau of the logit adjustment z + tau log(pi)")
    absent_classes: str = option(Options(ABSENT_CLASSES), "a class the client lacks: neg_inf (log 0) | floor")
    kd_ramp_end: str = option(Options(RAMP_ENDS), "lambda reaches a at: half (floor(R/2) - 1) | end (R)")
    gmm_runs: int = option(Interval(int, 1), "mixture fits the detection votes over")
    distance: str = option(Options(DISTANCES), "DaAgg's distance: per_tensor | global_l2")
    distance_buffers: bool = option(Flag(), "include BatchNorm buffers in the distance")
    detect_transform: str = option(Options(DETECT_TRANSFORMS), "the detection losses' images: eval | train")
    redetect_every: int | None = option(Interval(int, 1, or_none=True),
                                        "null detects once; r: again every r rounds after the first detection")
    detect_counts: bool = option(Flag(), "the detection reply: false a present-class mask (the spec) | true "
                                         "per-class sample counts (read as the same mask)")

    def check_options(self, context: StrategyContext) -> None:
        """The warm-up must end before the run does and before lambda's ramp ends."""
        rounds = self.rounds_under(context.comm_budget, context.num_clients)
        begin, end = self.ramp_of(rounds)
        if begin >= rounds:
            raise InvalidValue("warmup", begin, f"allowed is fewer than the run's {rounds} rounds")
        if end <= begin:
            raise InvalidValue("warmup", begin, f"the distillation weight's ramp ends at round {end} (kd_ramp_end="
                                                f"{self.kd_ramp_end}); allowed is a warm-up shorter than that")

    def warmup_of(self, num_rounds: int) -> int:
        """T1 for a run of ``num_rounds`` rounds."""
        return self.warmup if self.warmup is not None else max(1, num_rounds // 10)

    def ramp_of(self, num_rounds: int) -> tuple[int, int]:
        """(b, e): lambda rises from round b (T1) to round e."""
        end = num_rounds // 2 - 1 if self.kd_ramp_end == "half" else num_rounds
        return self.warmup_of(num_rounds), end


def kd_weight_at(t: int, ceiling: float, begin: int, end: int) -> float:
    """lambda_t = a exp(-5 (1 - (clip(t, b, e) - b) / (e - b))^2): 0-ish at b, a from e on."""
    progress = (min(max(t, begin), end) - begin) / (end - begin)
    return float(ceiling * np.exp(-5.0 * (1.0 - progress) ** 2))


def state_distance(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], keys: Iterable[str],
                   per_tensor: bool) -> float:
    """The distance between two model states over ``keys`` (integer arrays skipped): the sum of each
    tensor's Frobenius norm, or the norm of all of them as one vector."""
    norms = [float(np.linalg.norm(np.asarray(a[key], np.float64) - np.asarray(b[key], np.float64)))
             for key in keys if np.asarray(a[key]).dtype.kind == "f"]
    return float(sum(norms)) if per_tensor else float(np.sqrt(sum(n * n for n in norms)))


def daagg_weights(states: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float], noisy: Sequence[bool],
                  keys: Collection[str], per_tensor: bool = True) -> list[float]:
    """DaAgg's weights n_i exp(-D(i)), normalised: D(i) = d(i) / max_j d(j), d(i) the distance of a
    noisy client's state to the nearest clean one (0 for clean clients). All clean or all noisy:
    the plain size weights (FedAvg)."""
    if all(noisy) or not any(noisy):
        return [size / sum(sizes) for size in sizes]
    clean = [state for state, flag in zip(states, noisy) if not flag]
    d = np.array([min(state_distance(state, other, keys, per_tensor) for other in clean) if flag else 0.0
                  for state, flag in zip(states, noisy)])
    scaled = d / d.max() if d.max() > 0 else d
    raw = np.asarray(sizes, dtype=np.float64) * np.exp(-scaled)
    return [float(w) for w in raw / raw.sum()]


class FedNoRo(FedAvg):
    """FedAvg's sampling with FedNoRo's warm-up, detection, distillation and DaAgg. Its clients train
    with FedNoRo's own objective (learner ``ce`` in the train block), one network; it is not offered
    as FedCorr's stage 3: its warm-up and detection are a run of their own."""

    name = "fednoro"
    late_joiners = False  # it queries every client in some rounds
    settings: FedNoRoSettings
    learner = "ce"
    two_networks = False
    stage3 = False
    plugin = PLUGIN
    # Its warm-up (a tenth of the rounds by default) and its distillation ramp scale with the budget.
    budget_sized = None

    def __init__(self, settings: FedNoRoSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage or WARMUP)
        self.warmup = settings.warmup_of(self.num_rounds)
        self.ramp = settings.ramp_of(self.num_rounds)
        self.detections: list[dict[str, Any]] = []
        self.noisy: frozenset[int] | None = None
        self.agreement: float | None = None
        self.scores: dict[int, float] = {}
        self.queries = 0

    def plugin_ins(self, pid: int) -> FedNoRoIns:
        """Client ``pid``'s role and lambda_t this round (0 for clean clients and in the warm-up)."""
        s = self.settings
        noisy = self.noisy is not None and pid in self.noisy
        weight = kd_weight_at(self.stage_rounds, s.kd_weight, *self.ramp) if noisy else 0.0
        return FedNoRoIns(noisy=noisy, kd_weight=weight, temperature=s.kd_temperature, la_tau=s.la_tau,
                          absent_classes=s.absent_classes)

    def stage_ends(self) -> list[int]:
        """The warm-up's last round (detection comes next)."""
        return [self.warmup]

    def detection_due(self) -> bool:
        """Whether to detect before this round: right after the warm-up, and with ``redetect_every``
        every that many rounds after."""
        since = self.stage_rounds - self.warmup
        if since < 0:
            return False
        every = self.settings.redetect_every
        return self.noisy is None or bool(every and since > 0 and since % every == 0)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Detect when due (``detection_due``), then send each sampled client its role and lambda_t."""
        self.global_arrays = arrays
        if self.detection_due():
            self.detect(grid, arrays, server_round)
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedAvg in the warm-up, DaAgg after it."""
        states, sizes = client_states(replies), example_counts(replies)
        if self.noisy is None:
            return as_record(weighted_average(states, sizes))
        keys = states[0].keys() if self.settings.distance_buffers else self.context.parameter_names
        weights = daagg_weights(states, sizes, [pid in self.noisy for pid in replies], keys,
                                self.settings.distance == "per_tensor")
        return as_record(weighted_average(states, weights))

    def detect(self, grid: Grid, arrays: ArrayRecord, server_round: int = 0) -> None:
        """Every client's per-class losses of the current global model, and the voted noisy set S_n."""
        counts = self.settings.detect_counts
        query = instruction(ClassLossIns(self.settings.detect_transform, server_round, counts=counts), arrays=arrays)
        replies = self.exchange(grid, dict.fromkeys(self.federation.partition_ids, query), CLASS_LOSS,
                                lambda content, sender: read_class_losses(content, sender, counts))
        self.queries += len(replies)
        pids = sorted(replies)
        widths = {len(replies[pid].losses) for pid in pids}
        if len(widths) != 1:
            raise ProtocolError("the clients", "losses", f"have different lengths {sorted(widths)}")
        # Only which classes a client has enters the detection: a count is read as its mask.
        matrix = normalised_class_losses(np.array([replies[pid].losses for pid in pids]),
                                         np.array([replies[pid].presence() for pid in pids]))
        # The first detection's stream keeps its name; a re-detection's is named by its round.
        stream = "fednoro-detection" if not self.detections else f"fednoro-detection/{self.stage_rounds}"
        seeds = [int(s) for s in rng_for(self.context.seed, stream).integers(2**31, size=self.settings.gmm_runs)]
        rows, self.agreement = voted_noisy_rows(matrix, seeds)
        self.noisy = frozenset(pids[row] for row in rows)
        self.scores = {pid: float(matrix[i].sum()) for i, pid in enumerate(pids)}
        self.stage = DISTILL
        block = detection_block(self.noisy, self.context.truth)
        self.detections.append({"after_round": self.stage_rounds, "noisy_clients": len(self.noisy),
                                "vote_agreement": self.agreement, "detection": block.get("detection")})
        what = counted(self.stage_rounds, "warm-up round" if len(self.detections) == 1 else "round")
        again = "" if len(self.detections) == 1 else " (re-detection)"
        line = (f"[fednoro] detection after {what}{again}: {len(self.noisy)} of {len(pids)} "
                f"clients noisy ({100 * self.agreement:.0f}% of {self.settings.gmm_runs} mixture fits agree)")
        if block.get("detection"):
            d = block["detection"]
            line += f"; precision {d['precision']:.3f}, recall {d['recall']:.3f}, F1 {d['f1']:.3f}"
        print(line, flush=True)

    def result_blocks(self) -> dict[str, Any]:
        """The ``fednoro`` block: S_n (scored with ground truth), when and how it was found, per client."""
        block: dict[str, Any] = {
            "detected_after_round": self.warmup if self.noisy is not None else None,
            **detection_block(self.noisy or (), self.context.truth),
            "vote_agreement": self.agreement,
            "detections": self.detections,
            "class_loss_queries": self.queries,
            "clients": [{"client": pid, "loss_score": self.scores.get(pid),
                         "detected_noisy": self.noisy is not None and pid in self.noisy,
                         **({"true_noise": self.context.truth.true_noise[pid]} if self.context.truth else {})}
                        for pid in self.federation.partition_ids],
        }
        return {"fednoro": block}


def read_class_losses(content: RecordDict, sender: str, counts: bool) -> ClassLossRes:
    """A checked ``query.class_loss`` reply: finite losses and, per class loss, the count the server
    asked for (``counts``) or else the 0/1 mask, and not the other."""
    res = read_reply(content, ClassLossRes, sender)
    key, given, other = ("counts", res.counts, res.present) if counts else ("present", res.present, res.counts)
    if given is None:
        raise ProtocolError(sender, key, "is missing")
    if other is not None:
        raise ProtocolError(sender, "present" if counts else "counts", "was not asked for")
    allowed = "one count >= 0" if counts else "one 0 or 1"
    if len(given) != len(res.losses) or any(value < 0 or (not counts and value > 1) for value in given):
        raise ProtocolError(sender, key, f"must be {allowed} per class loss")
    if not all(np.isfinite(res.losses)):
        raise ProtocolError(sender, "losses", "must be finite numbers")
    return res
