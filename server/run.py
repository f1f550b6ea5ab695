"""The server side of a run: scene, discovery, strategy rounds, central evaluation, results."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid

from common.errors import InvalidValue
from common.seeding import rng_for
from data.scene import prepare_scene
from data.sources.base import Dataset
from protocol.messages import StateScope
from protocol.node_state import SIMULATION_STATE_DIR, inherit_folder
from server.checkpoints import (
    Checkpoint,
    CheckpointStore,
    Lineage,
    RunRecord,
    generator_states,
    numpy_arrays,
    read_checkpoint,
    restore_generators,
)
from server.config import RunPlan
from server.discovery import discover
from server.evaluation import CentralEvaluator
from server.held import check_nodes_hold_state
from server.live_curves import LiveCurves, open_live_curves
from server.progress import Progress, header
from server.provenance import provenance
from server.results import ResultsWriter
from settings.run import RunSettings
from strategies.base import FederatedStrategy, RoundInfo
from strategies.ground_truth import GroundTruth
from task.build import model_for


def initial_model(settings: RunSettings, dataset: Dataset, purpose: str = "model-init") -> torch.nn.Module:
    """The starting global model, initialised from the run's seed (``purpose`` names the stream:
    ``peer-init`` is Co-teaching's second network)."""
    torch.manual_seed(int(rng_for(settings.seed, purpose).integers(2**31)))
    return model_for(settings.model, dataset, settings.transforms)


def initial_arrays(settings: RunSettings, dataset: Dataset) -> ArrayRecord:
    """The starting global model's state dict as an ``ArrayRecord``."""
    return ArrayRecord(initial_model(settings, dataset).state_dict())


@runtime_checkable
class SkipsEvaluation(Protocol):
    """A strategy that leaves some of its rounds unevaluated (FedCorr's ``stage1_eval``)."""

    def skips_evaluation(self, server_round: int) -> bool:
        """Whether the global model after ``server_round`` needs no central evaluation."""


def never_skipped(server_round: int) -> bool:
    """No round is skipped: the strategy evaluates every round ``server.eval_every`` asks for."""
    return False


@dataclass(frozen=True)
class EvaluationSchedule:
    """The rounds the observer evaluates: every ``every``-th round the strategy does not skip, and
    always each stage's last round and the run's last round, so every stage's final model and the
    final accuracy are known."""

    every: int
    last: int
    stage_ends: frozenset[int] = frozenset()
    skipped: Callable[[int], bool] = never_skipped

    @classmethod
    def of(cls, settings: RunSettings, strategy: FederatedStrategy) -> EvaluationSchedule:
        """The schedule of ``strategy``'s rounds under ``server.eval_every``."""
        skipped = strategy.skips_evaluation if isinstance(strategy, SkipsEvaluation) else never_skipped
        return cls(settings.server.eval_every, strategy.planned_rounds(), frozenset(strategy.stage_ends()), skipped)

    def due(self, server_round: int) -> bool:
        """Whether the global model after ``server_round`` is evaluated."""
        if server_round == self.last or server_round in self.stage_ends:
            return True
        return server_round % self.every == 0 and not self.skipped(server_round)


class RoundReporter:
    """The run's observer: evaluates the global model when the schedule says, writes the round to
    the results and prints its progress line. Returns the evaluation for the strategy's Result."""

    def __init__(self, schedule: EvaluationSchedule, evaluator: CentralEvaluator, results: ResultsWriter,
                 planned_clients: Callable[[int], int], live: LiveCurves | None = None) -> None:
        self.schedule = schedule
        self.evaluator = evaluator
        self.results = results
        self.progress = Progress(schedule, planned_clients)
        self.live = live

    def __call__(self, info: RoundInfo, arrays: ArrayRecord) -> MetricRecord | None:
        """Report a finished round; the global model's accuracy and loss when it was evaluated, else None."""
        scores, confusion, eval_s = None, None, None
        if self.schedule.due(info.round):
            started = time.monotonic()
            scores, confusion = self.evaluator(arrays)
            eval_s = time.monotonic() - started
        row = self.results.add_round(
            server_round=info.round, stage=info.stage, clients=info.clients, comm_cost=info.comm_cost,
            test_acc=None if scores is None else scores.accuracy,
            test_loss=None if scores is None else scores.loss, train_loss=info.train_loss,
            test_confusion=confusion,
        )
        self.progress.update(row, eval_s)
        if self.live is not None:
            self.live.round(row)
        return None if scores is None else MetricRecord({"accuracy": scores.accuracy, "loss": scores.loss})


@dataclass(frozen=True)
class Start:
    """Where a run starts (``how``): from round 0 (``fresh``), from its own last checkpoint
    (``resumed``: ``resume=true``), from another run's at the end of its stage 2 (``stages12``:
    ``strategy.stages12_from``) or at the end of a shorter run of its config (``extended``:
    ``extend_from``)."""

    lineage: Lineage
    checkpoint: Checkpoint | None = None
    how: str = "fresh"

    def take_over(self, strategy: FederatedStrategy) -> None:
        """Give ``strategy`` the checkpoint's state the way this start asks (none for a fresh start)."""
        if self.checkpoint is None:
            return
        state = self.checkpoint.strategy
        {"stages12": strategy.inherit, "extended": strategy.extend}.get(self.how, strategy.restore)(state)
        strategy.log.restore(self.checkpoint.log)
        restore_generators(strategy.rng, self.checkpoint.generators)


def taken_from(settings: RunSettings, strategy: FederatedStrategy) -> tuple[str, int, str] | None:
    """The run this run starts from, the round of its checkpoint and how (``stages12`` or
    ``extended``); None for a run from round 0 (``load_run`` checked the source)."""
    if settings.extend_from is not None:
        store = CheckpointStore(Path(settings.extend_from).expanduser())
        return settings.extend_from, max(store.rounds()), "extended"
    source = strategy.settings.starts_from(settings.num_clients)
    return None if source is None else (*source, "stages12")


def starting_point(settings: RunSettings, strategy: FederatedStrategy, store: CheckpointStore) -> Start:
    """The run's start (the config was checked against the checkpoint's run by ``load_run``). A fresh
    run removes the folder's earlier checkpoints and simulated node state."""
    store.remove_partial()
    latest = store.latest() if settings.resume else None
    record = store.record()
    if latest is not None and record is not None:
        checkpoint = read_checkpoint(latest)
        print(f"resuming {settings.out_dir} from its checkpoint of round {checkpoint.round}", flush=True)
        return Start(record.lineage.resumed(checkpoint.round), checkpoint, "resumed")
    store.clear()
    shutil.rmtree(Path(settings.out_dir) / SIMULATION_STATE_DIR, ignore_errors=True)
    source = taken_from(settings, strategy)
    if source is None:
        return Start(Lineage.fresh())
    folder, checkpoint_round, how = source
    parent = CheckpointStore(Path(folder).expanduser())
    path, parent_record = parent.at(checkpoint_round), parent.record()
    assert path is not None and parent_record is not None  # load_run checked both
    checkpoint = read_checkpoint(path)
    inherit_folder(parent.dir.parent / SIMULATION_STATE_DIR, Path(settings.out_dir) / SIMULATION_STATE_DIR,
                   parent_record.lineage.run)
    what = "its stages 1-2" if how == "stages12" else f"its last round, to comm_budget={settings.comm_budget}"
    print(f"starting after round {checkpoint_round} of {folder} ({what})", flush=True)
    return Start(checkpoint.lineage.child(checkpoint_round), checkpoint, how)


Continuation = tuple[str, bool | str]
"""The key and value by which a run continues from a checkpoint."""


def continuation(settings: RunSettings, strategy: FederatedStrategy, store: CheckpointStore) -> Continuation | None:
    """The key and value by which the run continues from a checkpoint (its own: ``resume``; another
    run's: ``extend_from`` or ``strategy.stages12_from``); None for a run from round 0."""
    source = strategy.settings.starts_from(settings.num_clients)
    if settings.resume and store.latest() is not None:
        return "resume", True
    if settings.extend_from is not None:
        return "extend_from", settings.extend_from
    if source is not None:
        return "strategy.stages12_from", source[0]
    return None


def check_nodes_keep_state(strategy: FederatedStrategy, continued: Continuation | None) -> None:
    """A run that continues from a checkpoint needs every node's state as it was there: refuse when
    some nodes keep theirs in memory only (deployed without ``state-dir``), since they would start
    over from their own labels and the run would go on silently on the wrong state."""
    missing = sorted(strategy.federation.without_state)
    if not missing or continued is None:
        return
    raise InvalidValue(*continued, f"nodes that keep their state on disk; the nodes of partitions {missing[:10]}"
                                   f"{' ...' if len(missing) > 10 else ''} have no state-dir, so they would start "
                                   "over from their own labels (start them with --state-dir, or start the run over)")


class Checkpointer:
    """Writes the run's checkpoints after the rounds due: every ``server.checkpoint_every`` rounds,
    after each stage's last round, and after the run's last round."""

    def __init__(self, settings: RunSettings, store: CheckpointStore, strategy: FederatedStrategy,
                 results: ResultsWriter, lineage: Lineage) -> None:
        self.every = settings.server.checkpoint_every
        self.store = store
        self.strategy = strategy
        self.results = results
        self.lineage = lineage
        self.stage_ends = set(strategy.stage_ends())
        self.last = strategy.planned_rounds()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> None:
        """Write the checkpoint of ``server_round`` when one is due."""
        stage_end = server_round in self.stage_ends
        if not (stage_end or server_round % self.every == 0 or server_round == self.last):
            return
        self.store.write(Checkpoint(
            round=server_round, arrays=numpy_arrays(arrays), strategy=self.strategy.state(),
            log=self.strategy.log.state(), generators=generator_states(self.strategy.rng),
            results=self.results.state(), lineage=self.lineage,
        ), stage_end)
        self.results.blocks(self.strategy.result_blocks())

    def scope(self, server_round: int) -> StateScope:
        """The state scope of ``server_round``'s instructions: this run's lineage and the kept checkpoints."""
        return self.lineage.scope(server_round, self.store.rounds())


def run_server(grid: Grid, plan: RunPlan, command: str | None = None, overrides: str | None = None) -> dict[str, Any]:
    """Run the planned strategy over the nodes of ``grid`` (from round 0, or from the checkpoint the
    config says); returns the final results payload. ``command`` and ``overrides``: what started the
    run, for its provenance in results.json (None: not known to this process)."""
    settings = plan.settings
    print(header(settings, plan.strategy.name), flush=True)
    scene, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
    model = initial_model(settings, dataset)
    truth = GroundTruth.from_scene(scene) if settings.ground_truth else None
    context = plan.context(parameter_names=tuple(name for name, _ in model.named_parameters()), truth=truth,
                           new_network=lambda: ArrayRecord(initial_model(settings, dataset, "peer-init").state_dict()))
    strategy = plan.strategy.build(context)
    strategy.bind(discover(grid, settings.num_clients, settings.server.node_wait_timeout,
                           settings.server.round_timeout))
    store = CheckpointStore(settings.out_dir, settings.server.keep_checkpoints)
    continued = continuation(settings, strategy, store)
    check_nodes_keep_state(strategy, continued)
    start = starting_point(settings, strategy, store)
    if continued is not None and start.checkpoint is not None and strategy.node_state():
        check_nodes_hold_state(grid, strategy.federation, start.lineage.scope(start.checkpoint.round, store.rounds()),
                               start.checkpoint.log.get("answered", {}), *continued, settings.server.round_timeout)
    arrays = ArrayRecord(model.state_dict())
    checkpoint = start.checkpoint
    results = ResultsWriter(settings.out_dir, settings.resolved, None if checkpoint is None else checkpoint.results,
                            provenance(command, overrides))
    start.take_over(strategy)
    if checkpoint is not None:
        arrays = checkpoint.global_arrays()
        results.blocks(strategy.result_blocks())  # as of the checkpoint, until the next one refreshes them
    store.write_record(RunRecord(settings.resolved, start.lineage))
    live = open_live_curves(settings, strategy.result_blocks, results.rounds)
    strategy.observe(RoundReporter(EvaluationSchedule.of(settings, strategy), CentralEvaluator(settings, dataset),
                                   results, strategy.planned_clients, live))
    checkpointer = Checkpointer(settings, store, strategy, results, start.lineage)
    strategy.log.checkpoint = checkpointer
    strategy.log.scope = checkpointer.scope
    finished = False
    try:
        strategy.start(grid, arrays, timeout=settings.server.round_timeout)
        finished = True
    finally:
        if live is not None:
            live.close(finished)
    blocks = strategy.result_blocks()
    for name, block in blocks.items():
        results.write_table(f"{name}_clients.csv", block.get("clients", []))
    results.write_arrays(strategy.result_arrays())
    return results.finish(**blocks, attempts=attempts_block(settings, strategy, start.lineage, results.rounds))


def attempts_block(settings: RunSettings, strategy: FederatedStrategy, lineage: Lineage,
                   rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """results.json's ``attempts``: the checkpoint rounds the run resumed from, and the run whose
    stages 1-2 it took over or which it extended, with that run's time up to there (which
    ``summary.wall_s`` and every ``elapsed_s`` include)."""
    block: dict[str, Any] = {"resumed_at": list(lineage.resumed_at), "stages12_from": None, "extended_from": None}
    if lineage.parent:
        taken = next(row["elapsed_s"] for row in rounds if row["round"] == lineage.parent_round)
        started = strategy.settings.starts_from(settings.num_clients)
        key, folder = ("extended_from", settings.extend_from) if settings.extend_from is not None else (
            "stages12_from", started[0] if started else None)
        block[key] = {"run_dir": folder, "round": lineage.parent_round, "elapsed_s": taken}
    return block
