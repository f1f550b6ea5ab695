"""The server side of a run: scene, discovery, strategy rounds, central evaluation, results."""

from __future__ import annotations

import logging
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from omegaconf import DictConfig, OmegaConf

from client.setup import configured_model
from data.scene import prepare_scene
from data.seeding import rng_for
from server.checks import check_run_config
from server.discovery import discover
from server.evaluation import CentralEvaluator
from server.progress import Progress
from server.results import ResultsWriter
from strategies.fedcorr_metrics import GroundTruth
from strategies.registry import build_strategy

log = logging.getLogger(__name__)


def initial_model(cfg: DictConfig, dataset) -> torch.nn.Module:
    """The starting global model, initialised from the run's seed."""
    torch.manual_seed(int(rng_for(cfg.seed, "model-init").integers(2**31)))
    return configured_model(cfg, dataset)


def initial_arrays(cfg: DictConfig, dataset) -> ArrayRecord:
    return ArrayRecord(initial_model(cfg, dataset).state_dict())


def run_server(grid: Grid, cfg: DictConfig) -> dict[str, Any]:
    """Run the configured strategy over the nodes of ``grid``; returns the final results payload."""
    check_run_config(cfg)
    results = ResultsWriter(cfg.out_dir, OmegaConf.to_container(cfg, resolve=True))
    scene, dataset, _ = prepare_scene(cfg)
    model = initial_model(cfg, dataset)
    strategy = build_strategy(cfg, rng_for(cfg.seed, "client-sampling"), GroundTruth.from_scene(scene),
                              parameter_names=[name for name, _ in model.named_parameters()])
    strategy.bind(discover(grid, cfg.num_clients, cfg.server.node_wait_timeout, cfg.server.round_timeout))
    evaluator = CentralEvaluator(cfg, dataset)
    num_rounds = strategy.planned_rounds()
    progress = Progress(num_rounds)

    def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        info = strategy.history[-1]
        due = server_round % cfg.server.eval_every == 0 or server_round == num_rounds
        scores = evaluator(arrays) if due else {}
        row = results.add_round(
            server_round=server_round, stage=info.stage, clients=info.clients, comm_cost=info.comm_cost,
            test_acc=scores.get("accuracy"), test_loss=scores.get("loss"), train_loss=info.train_loss,
        )
        progress.update(row)
        return MetricRecord({"accuracy": scores["accuracy"], "loss": scores["loss"]}) if scores else None

    strategy.start(
        grid,
        ArrayRecord(model.state_dict()),
        num_rounds=num_rounds,
        timeout=float(cfg.server.round_timeout),
        train_config=ConfigRecord(OmegaConf.to_container(cfg.strategy.train)),
        evaluate_fn=after_round,
    )
    extra = strategy.extra_results()
    for name, block in extra.items():
        results.write_table(f"{name}_clients.csv", block.get("clients", []))
    return results.finish(**extra)
