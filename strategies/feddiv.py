"""FedDiv (Li et al., AAAI 2024): a federated noise filter and
predictive-consistency sampling.

Warm-up (FedCorr's pre-processing schedule, the released code's): T_wu iterations; each visits every
client once, one client per round in a seeded random order (omega_wu = 1/N), and the global model
becomes that client's weights; clients train with mixup (+ eta L_reg) on all their samples. With
``warmup_schedule=rounds`` the same participations are ordinary FedAvg rounds of omega N sampled
clients (the paper's count of T_wu / omega rounds).
Main phase, T rounds: a uniform sample of omega N clients trains from the global model with the
global filter (``client/methods/feddiv.py``); the server averages their weights (FedAvg), caches each
client's returned local filter with its n_k, and the global filter becomes the n_k-weighted average
of every cached filter (eq. 5): clients that did not train this round still count with the filter
they sent last (``filter_scope=round``: only this round's filters, Table 5's "degraded" filter).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from common.errors import ConfigError, InvalidValue
from common.validation import Interval, Options, option
from protocol.feddiv import PLUGIN, FedDivClientSettings, FedDivIns, FedDivRes
from protocol.messages import TRAIN, TrainIns, instruction, read_extra
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.detection import counted_scores, detection_block, mean_abs_error, missing_diagnostics
from strategies.fedavg import FedAvg
from strategies.federation import Federation
from strategies.ground_truth import GroundTruth
from strategies.rounds import RoundSettings
from task.noise_filter import NoiseFilter, aggregate_filters

log = logging.getLogger(__name__)

WARMUP, MAIN = "warmup", "main"
# How the global filter's variances are averaged: ``linear`` with gamma_k (eq. 5), ``squared`` with
# gamma_k^2 (the released code; narrower Gaussians).
VARIANCE_AGGREGATIONS = ("linear", "squared")
# The warm-up's schedule: one client per round, each once per iteration (``sequential``, the code),
# or ordinary rounds of omega N sampled clients (``rounds``, T_wu / omega of them as the paper counts).
WARMUP_SCHEDULES = ("sequential", "rounds")
NO_WRONG_LABEL_REASON = ("no sample the clients split has a wrong label: there is nothing to flag, so recall and F1 "
                         "are undefined")


@dataclass(frozen=True)
class FedDivSettings(RoundSettings):
    """FedDiv's settings (``conf/strategy/feddiv.yaml``; supplement Table 2 and the main text): the
    main phase's schedule (``num_rounds``: T; ``fraction``: omega), the warm-up, and the client-side
    settings as flat keys. Its train block's learner must be ``ce``: FedDiv trains with its own
    objective."""

    params: FedDivClientSettings = option(meaning="the clients' settings (flat keys of this block)", flat=True)
    warmup_iterations: int = option(Interval(int, 0), "T_wu, warm-up iterations (every client once per iteration)")
    eta: float | None = option(Interval(float, 0.0, or_none=True),
                               "L_reg's weight (null: 1 on non-IID partitions, 0 on IID)")
    variance_aggregation: str = option(Options(VARIANCE_AGGREGATIONS),
                                       "the filters' variances: linear (eq. 5) | squared (gamma_k^2)")
    warmup_schedule: str = option(Options(WARMUP_SCHEDULES),
                                  "sequential: one client per round | rounds: T_wu / fraction rounds of fraction N")

    def check(self) -> None:
        """FedDiv's own objective."""
        if self.train.learner != "ce":
            raise InvalidValue("train.learner", self.train.learner,
                               "ce: FedDiv's clients train with its own objective (mixup + L_reg)")

    def check_run(self, context: StrategyContext) -> None:
        """The round size must fit, and the budget leave a main round after the warm-up."""
        self.check_round_size(context)
        if self.main_rounds_under(context.comm_budget, context.num_clients) < 1:
            raise ConfigError(f"comm_budget={context.comm_budget} is invalid: too small; FedDiv's warm-up spends "
                              f"{self.warmup_participations(context.num_clients)} participations and leaves no "
                              "main round")

    def warmup_rounds(self, num_clients: int) -> int:
        """The warm-up's rounds: T_wu * N of one client, or enough rounds of omega N clients for as
        many participations (T_wu / omega when omega N is whole)."""
        participations = self.warmup_iterations * num_clients
        if self.warmup_schedule == "sequential":
            return participations
        return -(-participations // self.round_size(num_clients))

    def warmup_participations(self, num_clients: int) -> int:
        """The client participations the warm-up spends."""
        per_round = 1 if self.warmup_schedule == "sequential" else self.round_size(num_clients)
        return self.warmup_rounds(num_clients) * per_round

    def main_rounds_under(self, comm_budget: int | None, num_clients: int) -> int:
        """T, or with a budget the main rounds the warm-up's participations leave."""
        return self.rounds_under(comm_budget, num_clients, self.warmup_participations(num_clients),
                                 "FedDiv's warm-up")

    def client_ins(self, iid: bool, seed: int, diagnostics: bool) -> FedDivIns:
        """What every client gets (the server fills in the phase and the global filter)."""
        eta = self.eta if self.eta is not None else (0.0 if iid else 1.0)
        return FedDivIns(phase=WARMUP, params=self.params, eta=eta, seed=seed, diagnostics=diagnostics)


class FedDivMonitor:
    """What FedDiv believes about its clients, and with ground truth how right it is: per client its
    latest noise estimate delta_hat (>= the clean-client threshold: treated as noisy), the sample
    split, the relabelling and the label noise of what clients trained on. ``results()`` is the
    ``feddiv`` block of results.json. A client whose truth the scene knows but that reports without
    ground-truth counts (a deployed node that does not allow them) makes every figure built from
    them null, with the reason (``label_noise_not_available``)."""

    def __init__(self, clients: list[int], threshold: float, truth: GroundTruth | None) -> None:
        self.clients, self.threshold, self.truth = list(clients), threshold, truth
        self.missing: set[int] = set()
        self.estimates: dict[int, float] = {}
        self.totals: dict[str, int] = {}
        self.class_totals: dict[str, np.ndarray] = {}
        self.global_filter: NoiseFilter | None = None
        self.filters: list[dict[str, Any]] = []

    def round(self, server_round: int, reports: Mapping[int, FedDivRes], global_filter: NoiseFilter) -> None:
        """Fold in a main round's reports and the new global filter."""
        for pid, report in reports.items():
            self.estimates[pid] = report.noise_estimate
            if report.diagnostics is None and self.truth and self.truth.known.get(pid, 0) > 0:
                self.missing.add(pid)
            counts = {"relabeled": report.relabeled, "trained": report.trained,
                      **(asdict(report.diagnostics) if report.diagnostics else {})}
            for key, value in counts.items():
                if isinstance(value, tuple):  # a per-class vector
                    if value:
                        self.class_totals[key] = self.class_totals.get(key, 0) + np.asarray(value, dtype=np.int64)
                else:
                    self.totals[key] = self.totals.get(key, 0) + value
        if self.global_filter is None:
            print(f"[feddiv] first global filter (round {server_round}): {_filter_line(global_filter)}", flush=True)
        self.global_filter = global_filter
        self.filters.append({"round": server_round, **asdict(global_filter)})

    def results(self) -> dict[str, Any]:
        """The ``feddiv`` block."""
        detected = [pid for pid, estimate in self.estimates.items() if estimate >= self.threshold]
        t = self.totals
        block: dict[str, Any] = {
            "global_filter": asdict(self.global_filter) if self.global_filter else None,
            "global_filters": self.filters,
            "noise_estimates": {str(pid): value for pid, value in sorted(self.estimates.items())},
            "clients_seen": len(self.estimates),
            **detection_block(detected, self.truth),
            "relabeled": t.get("relabeled", 0),
            "trained_samples": t.get("trained", 0),
        }
        unknown = missing_diagnostics(self.missing)
        if self.truth and unknown:
            block.update({"noise_estimate_mae": mean_abs_error(self.estimates, self.truth.true_noise),
                          "sample_split": None, "sample_split_not_applicable": unknown, "relabel_precision": None,
                          "label_noise": None, "per_class": None, "label_noise_not_available": unknown})
            return block
        if self.truth and "known" in t:
            wrong = t["split_tp"] + t["split_fn"]
            block.update({
                "noise_estimate_mae": mean_abs_error(self.estimates, self.truth.true_noise),
                # Flagging wrong labels: the filter's split against the truth, summed over rounds; with
                # no wrong label to find its recall and F1 are undefined.
                "sample_split": counted_scores(t["split_tp"], t["split_tp"] + t["split_fp"], wrong) if wrong else None,
                "sample_split_not_applicable": None if wrong else NO_WRONG_LABEL_REASON,
                "relabel_precision": t["relabeled_correct"] / t["relabeled"] if t["relabeled"] else None,
                "label_noise": {"given": t["wrong"] / t["known"] if t["known"] else None,
                                "trained": t["trained_wrong"] / t["trained"] if t["trained"] else None},
                "label_noise_not_available": None,
            })
        if self.truth and "class_known" in self.class_totals:
            c = self.class_totals
            # Per true class, over the main rounds: the share of its samples that clients trained on
            # (last epoch), and the share of those trained with a wrong label.
            block["per_class"] = {
                "kept": [float(k) / n if n else None for k, n in zip(c["class_trained"], c["class_known"])],
                "trained_wrong": [float(w) / k if k else None
                                  for w, k in zip(c["class_trained_wrong"], c["class_trained"])],
            }
        return block


def _filter_line(f: NoiseFilter) -> str:
    return (f"clean N({f.mean_clean:.3f}, {f.var_clean:.4f}) x {f.weight_clean:.3f}, "
            f"noisy N({f.mean_noisy:.3f}, {f.var_noisy:.4f}) x {f.weight_noisy:.3f}")


class FedDiv(FedAvg):
    """FedDiv's warm-up and main phase (``num_rounds``: the main phase's). A warm-up round is a sample
    of ``fraction`` of the clients (``warmup_schedule=rounds``), else one client in a seeded order
    visiting every client once per iteration."""

    name = "feddiv"
    late_joiners = False  # it queries every client in some rounds
    settings: FedDivSettings
    stage3 = False
    plugin = PLUGIN
    # A client's noise filter is a 2-component mixture of its per-sample losses.
    min_client_samples = 2

    def __init__(self, settings: FedDivSettings, context: StrategyContext) -> None:
        super().__init__(settings, context)
        self.num_rounds = settings.main_rounds_under(context.comm_budget, context.num_clients)
        self.warmup_rounds = settings.warmup_rounds(context.num_clients)
        self.ins = settings.client_ins(context.iid, context.seed, context.truth is not None)
        self.stage = WARMUP if self.warmup_rounds else MAIN
        self._warmup_left = self.warmup_rounds
        self._order: list[int] = []
        self.cache: dict[int, tuple[NoiseFilter, int]] = {}
        self.global_filter: NoiseFilter | None = None
        self.monitor: FedDivMonitor | None = None

    def node_state(self) -> bool:
        """True: its clients keep their prior (and the cached sampler's labels) between rounds."""
        return True

    def bind(self, federation: Federation) -> None:
        """Bind the federation and start the monitor."""
        super().bind(federation)
        self.monitor = FedDivMonitor(federation.partition_ids, self.ins.params.clean_client, self.context.truth)

    def planned_rounds(self) -> int:
        """The warm-up's rounds, then T main rounds."""
        return self.warmup_rounds + self.num_rounds

    def stage_ends(self) -> list[int]:
        """The warm-up's last round, if there is a warm-up."""
        return [self.warmup_rounds] if self.warmup_rounds else []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """A warm-up round (the next client of this iteration's order) or a main round (a sample)."""
        self.global_arrays = arrays
        ins = TrainIns(server_round, self.train, plugin=self.plugin)
        if self._warmup_left > 0:
            self.stage = WARMUP
            if self.settings.warmup_schedule == "rounds":
                chosen = self.select(server_round, arrays, grid)
            else:
                if not self._order:
                    self._order = [int(pid) for pid in self.rng.permutation(self.federation.partition_ids)]
                chosen = [self._order.pop(0)]
            self._warmup_left -= 1
            plugin_ins = self.ins
        else:
            self.stage = MAIN
            chosen = self.select(server_round, arrays, grid)
            plugin_ins = replace(self.ins, phase=MAIN, filter=self.global_filter)
        content = instruction(ins, arrays=arrays, plugin_ins=plugin_ins, plugin=self.plugin)
        return self.messages({pid: content for pid in chosen}, TRAIN)

    def read_train(self, content: RecordDict, sender: str) -> TrainReply:
        """A ``train`` reply; in the main phase with the client's ``FedDivRes``."""
        reply = super().read_train(content, sender)
        if self.stage == WARMUP:
            return reply
        return TrainReply(reply.arrays, reply.result, read_extra(content, PLUGIN, FedDivRes, sender))

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedAvg of the weights; in the main phase also the filter cache and the new global filter."""
        arrays = super().aggregate(replies)
        if self.stage == MAIN:
            assert self.monitor is not None
            if self.settings.params.filter_scope == "round":
                self.cache.clear()
            for pid, reply in replies.items():
                self.cache[pid] = (reply.extra.filter, reply.result.num_examples)
            cached = [self.cache[pid] for pid in sorted(self.cache)]
            self.global_filter = aggregate_filters([f for f, _ in cached], [float(n) for _, n in cached],
                                                   squared_weights=self.settings.variance_aggregation == "squared")
            self.monitor.round(self.stage_rounds + 1, {pid: reply.extra for pid, reply in replies.items()},
                               self.global_filter)
        return arrays

    def result_blocks(self) -> dict[str, Any]:
        """The ``feddiv`` block (see ``FedDivMonitor``)."""
        return {"feddiv": self.monitor.results()} if self.monitor else {}
