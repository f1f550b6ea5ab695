"""Client updates and training samples per second: the same FedAvg rounds (same clients, batches and
seeds) (a) through the Flower simulation on Ray, (b) as the plain sequential loop over the same
clients, and (c) as a bare PyTorch loop over the same tensors, the limit of this machine.

    .venv/bin/python bench/throughput.py [--rounds 10] [Hydra overrides, default experiment=fmnist strategy=fedavg]

(b) calls the very functions the ClientApp and the server use (client.update.local_update, FedAvg's
sampling and averaging, the central evaluator), one client after another with the per-client thread
count. (c) trains the same clients of the same rounds with the same model, optimiser, batch size
and steps on their images already normalised in memory, and nothing else: no augmentation, no
hooks, no messages, no evaluation. The simulation runs the work on parallel Ray actors, so the
work-normalised ratio simulation / plain (wall x actors / plain wall) is what Flower, Ray and our
handlers add per unit of training (> 1: overhead); the plain wall ratio is what a user waits.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import sim  # noqa: E402
from client.node import LocalNode, load_node  # noqa: E402
from client.update import cpu_state, local_update  # noqa: E402
from data.scene import prepare_scene  # noqa: E402
from server.config import load_run  # noqa: E402
from server.evaluation import CentralEvaluator  # noqa: E402
from server.run import initial_arrays  # noqa: E402
from settings.compose import compose_config  # noqa: E402
from strategies.aggregation import weighted_average  # noqa: E402
from strategies.fedavg import FedAvg  # noqa: E402
from strategies.federation import Federation  # noqa: E402
from task.hooks import TrainingHooks  # noqa: E402
from task.local_training import LocalTraining  # noqa: E402


@dataclass(frozen=True)
class Throughput:
    """One way of running the rounds: its wall seconds and the work it did."""

    name: str
    wall_s: float
    updates: int
    samples: int

    def line(self) -> str:
        """The row: wall time, client updates per second, training samples per second."""
        return (f"  {self.name:<34} {self.wall_s:8.1f} s  {self.updates / self.wall_s:7.3f} updates/s  "
                f"{self.samples / self.wall_s:9.0f} samples/s")


@dataclass
class Plan:
    """The rounds to run: each round's clients, the nodes and the local training."""

    rounds: list[list[int]]
    nodes: dict[int, LocalNode]
    training: LocalTraining
    strategy: FedAvg
    overrides: list[str]

    def samples(self) -> int:
        """Training samples processed: every epoch of every client update."""
        return sum(len(self.nodes[pid].data) for clients in self.rounds for pid in clients) * self.training.epochs

    def updates(self) -> int:
        """Client updates in all rounds."""
        return sum(len(clients) for clients in self.rounds)


def plan_rounds(cfg: DictConfig, overrides: list[str]) -> Plan:
    """The FedAvg rounds of ``cfg``: the clients FedAvg's seeded sampling picks, and their nodes."""
    run = load_run(cfg)
    settings = run.settings
    strategy = run.strategy.build(run.context())
    assert isinstance(strategy, FedAvg)
    clients = range(settings.num_clients)
    strategy.bind(Federation(node_of={k: k for k in clients}, num_examples={k: 0 for k in clients}))
    prepare_scene(settings.scene, settings.out_dir)
    run_config = {"overrides": shlex.join(overrides)}
    nodes = {pid: load_node(Context(run_id=1, node_id=pid, node_config={"partition-id": pid}, state=RecordDict(),
                                    run_config=dict(run_config)))
             for pid in clients}
    no_grid = cast(Grid, None)  # FedAvg's uniform sampling asks no node
    rounds = [strategy.select(r, ArrayRecord(), no_grid) for r in range(1, strategy.planned_rounds() + 1)]
    return Plan(rounds, nodes, strategy.settings.train, strategy, overrides)


def plain_loop(cfg: DictConfig, plan: Plan) -> tuple[Throughput, list[float]]:
    """FedAvg as a sequential loop of our client and server functions; its throughput and accuracies."""
    start = time.perf_counter()
    settings = load_run(cfg).settings
    _, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
    evaluator = CentralEvaluator(settings, dataset)
    state: Mapping[str, torch.Tensor] = initial_arrays(settings, dataset).to_torch_state_dict()
    accuracies = []
    for server_round, clients in enumerate(plan.rounds, start=1):
        states, weights = [], []
        for pid in clients:
            model, stats = local_update(plan.nodes[pid], state, TrainingHooks(plan.training), server_round)
            states.append({key: value.numpy() for key, value in cpu_state(model).items()})
            weights.append(stats.num_examples)
        state = {key: torch.from_numpy(value) for key, value in weighted_average(states, weights).items()}
        accuracies.append(evaluator(ArrayRecord(state))[0].accuracy)
    wall = time.perf_counter() - start
    return Throughput("(b) plain sequential loop", wall, plan.updates(), plan.samples()), accuracies


def bare_update(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, training: LocalTraining,
                generator: torch.Generator) -> None:
    """Local SGD and nothing else: shuffled batches of in-memory tensors, cross-entropy, a step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=training.lr, momentum=training.momentum,
                                weight_decay=training.weight_decay)
    model.train()
    for _ in range(training.epochs):
        for rows in torch.randperm(len(labels), generator=generator).split(training.batch_size):
            loss = F.cross_entropy(model(images[rows]), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def bare_loop(plan: Plan) -> Throughput:
    """The same client updates as a bare PyTorch loop over tensors prepared beforehand (not timed)."""
    tensors = {pid: (node.eval_transform(torch.from_numpy(np.asarray(node.data.images))),
                     torch.from_numpy(node.data.labels.astype(np.int64))) for pid, node in plan.nodes.items()}
    model = plan.nodes[0].new_model()
    start_state = {key: value.clone() for key, value in model.state_dict().items()}
    start = time.perf_counter()
    for server_round, clients in enumerate(plan.rounds, start=1):
        for pid in clients:
            model.load_state_dict(start_state)
            bare_update(model, *tensors[pid], plan.training, plan.nodes[pid].generator(server_round))
    wall = time.perf_counter() - start
    return Throughput("(c) bare PyTorch loop", wall, plan.updates(), plan.samples())


def simulation(cfg: DictConfig, plan: Plan) -> tuple[Throughput, float, list[float]]:
    """The Flower simulation of the same rounds: its throughput, steady seconds per round, accuracies."""
    start = time.perf_counter()
    rows = sim.run(cfg, plan.overrides)["rounds"]
    wall = time.perf_counter() - start
    steady = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / max(1, len(rows) - 1)
    assert [row["clients"] for row in rows] == plan.rounds, "the simulation trains the same clients"
    return Throughput("(a) Flower simulation (Ray)", wall, plan.updates(), plan.samples()), steady, \
        [row["test_acc"] for row in rows]


def main() -> None:
    """Run the three ways over the same rounds and print their throughput and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("overrides", nargs="*", default=["experiment=fmnist", "strategy=fedavg"])
    args = parser.parse_args()
    overrides = [*args.overrides, f"strategy.num_rounds={args.rounds}", "out_dir=outputs/bench-throughput"]
    cfg = compose_config(overrides)
    plan = plan_rounds(cfg, overrides)
    torch.set_num_threads(plan.nodes[0].settings.client.num_threads)
    plain, plain_acc = plain_loop(cfg, plan)
    bare = bare_loop(plan)
    torch.set_num_threads(os.cpu_count() or 1)
    simulated, steady, sim_acc = simulation(cfg, plan)
    actors = max(1, int((os.cpu_count() or 1) // cfg.simulation.num_cpus_per_client))

    print(f"{cfg.dataset.name}, {cfg.num_clients} clients, {cfg.model.name}, FedAvg fraction {cfg.strategy.fraction}, "
          f"{args.rounds} rounds, {plan.training.epochs} local epochs, batch {plan.training.batch_size}; "
          f"{os.cpu_count()} CPU cores, {actors} Ray actors x {cfg.simulation.num_cpus_per_client} CPU")
    for row in (simulated, plain, bare):
        print(row.line())
    print(f"  simulation steady {steady:.2f} s/round; "
          f"start-up and shut-down {simulated.wall_s - steady * args.rounds:.1f} s")
    print(f"  wall ratio simulation / plain:            {simulated.wall_s / plain.wall_s:6.3f}")
    print(f"  work-normalised simulation / plain ({actors} actors): {simulated.wall_s * actors / plain.wall_s:6.3f}"
          f"   target <= 1.10 (steady rounds only: {steady * args.rounds * actors / plain.wall_s:.3f})")
    print(f"  plain / bare (our training loop, evaluation and averaging over the bare loop): "
          f"{plain.wall_s / bare.wall_s:6.3f}")
    print(f"  final accuracy plain {plain_acc[-1]:.4f}, simulation {sim_acc[-1]:.4f}; "
          f"max per-round difference {np.max(np.abs(np.subtract(plain_acc, sim_acc))):.2e}")


if __name__ == "__main__":
    main()
