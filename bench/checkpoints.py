"""The size of a checkpoint and of the nodes' state, and the time to write a checkpoint, for the
fmnist and cifar10 presets:

    .venv/bin/python bench/checkpoints.py [--repeats 5]

For each preset and strategy it builds the preset's model and strategy (bound to a federation of the
preset's size), a results log of every planned round, and writes the checkpoint the server would
write at the last round (the size of a checkpoint grows only with those rows; FedDyn's h is
filled as after its first round). The nodes' state is
what each client keeps on disk: FedCorr's corrected labels (int64) and kept losses (float32) per
sample, and a model-sized float32 array per parameter for FedDyn's g_k (SCAFFOLD's c_i is the same
size). CIFAR-10 cannot be fetched here: its model is built from the preset's architecture for 3 x
32 x 32 inputs and 10 classes, and its clients hold 50,000 / N samples.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402

from models.registry import build_model  # noqa: E402
from server.checkpoints import Checkpoint, CheckpointStore, Lineage, generator_states, numpy_arrays  # noqa: E402
from server.config import load_run  # noqa: E402
from settings.compose import compose_config  # noqa: E402
from strategies.federation import Federation  # noqa: E402

# (channels, image size, training samples) of each preset's dataset.
DATASETS = {"fashion_mnist": (1, 28, 60_000), "cifar10": (3, 32, 50_000)}
CASES = [("fmnist", "fedcorr"), ("fmnist", "feddyn"), ("cifar10", "fedcorr"), ("cifar10", "feddyn")]


def megabytes(size: float) -> str:
    """``size`` bytes in MB, two decimals."""
    return f"{size / 1e6:,.2f} MB"


def measure(experiment: str, strategy_name: str, repeats: int) -> dict[str, str]:
    """One table row: the checkpoint's size and median write time, and the nodes' state sizes."""
    plan = load_run(compose_config([f"experiment={experiment}", f"strategy={strategy_name}", "out_dir=/tmp/unused"]))
    settings = plan.settings
    channels, size, samples = DATASETS[settings.scene.dataset.name]
    model = build_model(settings.model.name, num_classes=settings.scene.dataset.num_classes, in_channels=channels,
                        image_size=size, **settings.model.options)
    arrays = ArrayRecord(model.state_dict())
    n = settings.num_clients
    per_client = samples // n
    context = plan.context(parameter_names=tuple(name for name, _ in model.named_parameters()))
    strategy = plan.strategy.build(context)
    strategy.bind(Federation(node_of={pid: pid for pid in range(n)}, num_examples=dict.fromkeys(range(n), per_client)))
    rounds = strategy.planned_rounds()
    if strategy_name == "feddyn":
        # FedDyn's h is empty until its first round, then one float32 array per parameter.
        setattr(strategy, "h", {name: p.detach().numpy().copy() for name, p in model.named_parameters()})
    rows = [{"round": r, "stage": "usual", "test_acc": 0.5, "test_loss": 1.0, "clients": list(range(10)),
             "comm_cost": 10 * r, "train_loss": 1.0, "elapsed_s": float(r)} for r in range(1, rounds + 1)]
    checkpoint = Checkpoint(round=rounds, arrays=numpy_arrays(arrays), strategy=strategy.state(),
                            log=strategy.log.state(), generators=generator_states(strategy.rng),
                            results={"rounds": rows, "confusion": None, "elapsed_s": 0.0}, lineage=Lineage.fresh())
    times = []
    with tempfile.TemporaryDirectory() as folder:
        store = CheckpointStore(folder)
        for _ in range(repeats):
            start = time.perf_counter()
            path = store.write(checkpoint, stage_end=False)
            times.append(time.perf_counter() - start)
        checkpoint_bytes = path.stat().st_size
    parameters = sum(int(np.prod(p.shape)) for p in model.parameters())
    node = per_client * (8 + 4) if strategy_name == "fedcorr" else 4 * parameters
    return {
        "preset": f"{experiment} / {strategy_name} ({settings.model.name}, N={n}, {rounds} rounds)",
        "checkpoint": megabytes(checkpoint_bytes),
        "write (median)": f"{1000 * float(np.median(times)):,.0f} ms",
        "node state per client": megabytes(node),
        "node state, all clients": megabytes(node * n),
    }


def main() -> None:
    """Print the table for every case."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="writes per case (the median is printed)")
    args = parser.parse_args()
    table = [measure(experiment, name, args.repeats) for experiment, name in CASES]
    columns = list(table[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in table:
        print("| " + " | ".join(row[column] for column in columns) + " |")


if __name__ == "__main__":
    main()
