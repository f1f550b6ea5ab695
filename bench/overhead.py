"""What Flower's simulation engine costs: the same FedAvg rounds (same clients, batches and seeds)
(a) through the Flower simulation on Ray and (b) as a plain sequential PyTorch loop.

    .venv/bin/python bench/overhead.py [--rounds 20] [Hydra overrides, default experiment=fmnist strategy=fedavg]

The plain loop calls the very functions the ClientApp and the server use (client.update.local_update,
strategies' FedAvg sampling and averaging, the central evaluator), one client after another with
the per-client thread count. The simulation runs the same work on parallel Ray actors, so its wall
time is also shown normalised by the number of actors that fit (work-normalised ratio: > 1 means
Flower/Ray overhead per unit of training; the plain wall ratio shows what a user waits).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, RecordDict  # noqa: E402

import sim  # noqa: E402
from client.node import load_node  # noqa: E402
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


def plain_loop(cfg, overrides: list[str]) -> tuple[float, list[float]]:
    """FedAvg as a sequential PyTorch loop; returns wall seconds and per-round test accuracy."""
    start = time.perf_counter()
    plan = load_run(cfg)
    settings = plan.settings
    _, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
    strategy = plan.strategy.build(plan.context())
    clients = range(settings.num_clients)
    strategy.bind(Federation(node_of={k: k for k in clients}, num_examples={k: 0 for k in clients}))
    evaluator = CentralEvaluator(settings, dataset)
    state = initial_arrays(settings, dataset).to_torch_state_dict()
    assert isinstance(strategy, FedAvg)
    training = strategy.settings.train
    run_config = {"overrides": shlex.join(overrides)}
    accuracies = []
    for server_round in range(1, strategy.planned_rounds() + 1):
        states, weights = [], []
        for pid in strategy.select(server_round, ArrayRecord(state), grid=None):
            context = Context(run_id=1, node_id=pid, node_config={"partition-id": pid}, state=RecordDict(),
                              run_config=run_config)
            model, stats = local_update(load_node(context), state, TrainingHooks(training), server_round)
            states.append({key: value.numpy() for key, value in cpu_state(model).items()})
            weights.append(stats.num_examples)
        state = {key: torch.from_numpy(value) for key, value in weighted_average(states, weights).items()}
        accuracies.append(evaluator(ArrayRecord(state))[0].accuracy)
    return time.perf_counter() - start, accuracies


def main() -> None:
    """Run the plain loop and the Flower simulation on the same rounds, and print both timings and accuracies."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("overrides", nargs="*", default=["experiment=fmnist", "strategy=fedavg"])
    args = parser.parse_args()
    overrides = [*args.overrides, f"strategy.num_rounds={args.rounds}", "out_dir=outputs/bench-overhead"]
    cfg = compose_config(overrides)

    plain_s, plain_acc = plain_loop(cfg, overrides)
    start = time.perf_counter()
    payload = sim.run(cfg, overrides)
    sim_s = time.perf_counter() - start
    rounds = payload["rounds"]
    steady = (rounds[-1]["elapsed_s"] - rounds[0]["elapsed_s"]) / max(1, len(rounds) - 1)
    sim_acc = [r["test_acc"] for r in rounds]
    actors = max(1, int((os.cpu_count() or 1) // cfg.simulation.num_cpus_per_client))

    print(f"{cfg.dataset.name}, {cfg.num_clients} clients, {cfg.model.name}, FedAvg fraction {cfg.strategy.fraction}, "
          f"{args.rounds} rounds, {cfg.strategy.train.epochs} local epochs, batch {cfg.strategy.train.batch_size}; "
          f"{os.cpu_count()} CPU cores, {actors} Ray actors x {cfg.simulation.num_cpus_per_client} CPU")
    print(f"  plain sequential PyTorch loop:   {plain_s:8.1f} s   ({plain_s / args.rounds:.2f} s/round)")
    print(f"  Flower simulation (Ray), total:  {sim_s:8.1f} s   (steady {steady:.2f} s/round; start-up and "
          f"shut-down {sim_s - steady * args.rounds:.1f} s)")
    print(f"  wall ratio simulation / plain:   {sim_s / plain_s:8.3f}")
    print(f"  work-normalised ratio ({actors} actors): {sim_s * actors / plain_s:8.3f}   target <= 1.15")
    print(f"  final accuracy plain {plain_acc[-1]:.4f}, simulation {sim_acc[-1]:.4f}; "
          f"max per-round difference {np.max(np.abs(np.subtract(plain_acc, sim_acc))):.2e}")


if __name__ == "__main__":
    main()
