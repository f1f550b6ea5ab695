"""The server side of a run: scene, discovery, strategy rounds, central evaluation, results."""

from __future__ import annotations

import logging
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid

from common.seeding import rng_for
from data.scene import prepare_scene
from data.sources.base import Dataset
from server.config import RunPlan
from server.discovery import discover
from server.evaluation import CentralEvaluator
from server.live_curves import LiveCurves
from server.progress import Progress
from server.results import ResultsWriter
from settings.run import RunSettings
from strategies.base import RoundInfo
from strategies.ground_truth import GroundTruth
from task.build import model_for

log = logging.getLogger(__name__)


def initial_model(settings: RunSettings, dataset: Dataset, purpose: str = "model-init") -> torch.nn.Module:
    """The starting global model, initialised from the run's seed (``purpose`` names the stream:
    ``peer-init`` is Co-teaching's second network)."""
    torch.manual_seed(int(rng_for(settings.seed, purpose).integers(2**31)))
    return model_for(settings.model, dataset, settings.transforms)


def initial_arrays(settings: RunSettings, dataset: Dataset) -> ArrayRecord:
    """The starting global model's state dict as an ``ArrayRecord``."""
    return ArrayRecord(initial_model(settings, dataset).state_dict())


class RoundReporter:
    """The run's observer: evaluates the global model when due, writes the round to the results and
    prints its progress line. Returns the evaluation for the strategy's Result."""

    def __init__(self, settings: RunSettings, evaluator: CentralEvaluator, results: ResultsWriter,
                 num_rounds: int, live: LiveCurves | None = None) -> None:
        self.eval_every = settings.server.eval_every
        self.evaluator = evaluator
        self.results = results
        self.num_rounds = num_rounds
        self.progress = Progress(num_rounds)
        self.live = live

    def __call__(self, info: RoundInfo, arrays: ArrayRecord) -> MetricRecord | None:
        """Report a finished round; the global model's accuracy and loss when it was evaluated, else None."""
        due = info.round % self.eval_every == 0 or info.round == self.num_rounds
        scores, confusion = self.evaluator(arrays) if due else (None, None)
        row = self.results.add_round(
            server_round=info.round, stage=info.stage, clients=info.clients, comm_cost=info.comm_cost,
            test_acc=None if scores is None else scores.accuracy,
            test_loss=None if scores is None else scores.loss, train_loss=info.train_loss,
            test_confusion=confusion,
        )
        self.progress.update(row)
        if self.live is not None:
            self.live.round(row)
        return None if scores is None else MetricRecord({"accuracy": scores.accuracy, "loss": scores.loss})


def run_server(grid: Grid, plan: RunPlan) -> dict[str, Any]:
    """Run the planned strategy over the nodes of ``grid``; returns the final results payload."""
    settings = plan.settings
    results = ResultsWriter(settings.out_dir, settings.resolved)
    scene, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
    model = initial_model(settings, dataset)
    truth = GroundTruth.from_scene(scene) if settings.ground_truth else None
    context = plan.context(parameter_names=tuple(name for name, _ in model.named_parameters()), truth=truth,
                           new_network=lambda: ArrayRecord(initial_model(settings, dataset, "peer-init").state_dict()))
    strategy = plan.strategy.build(context)
    strategy.bind(discover(grid, settings.num_clients, settings.server.node_wait_timeout,
                           settings.server.round_timeout))
    num_rounds = strategy.planned_rounds()
    live = LiveCurves(settings.out_dir, strategy.result_blocks) if settings.logging.tensorboard else None
    strategy.observe(RoundReporter(settings, CentralEvaluator(settings, dataset), results, num_rounds, live))
    try:
        strategy.start(grid, ArrayRecord(model.state_dict()), timeout=settings.server.round_timeout)
    finally:
        if live is not None:
            live.close()
    blocks = strategy.result_blocks()
    for name, block in blocks.items():
        results.write_table(f"{name}_clients.csv", block.get("clients", []))
    return results.finish(**blocks)
