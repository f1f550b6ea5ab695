"""Vectorised clients, measured: the clients of one round trained one after another against all of them
at once with ``torch.func`` (issue 29, part 5).

    .venv/bin/python bench/vectorised.py [--ks 2 5 10 20] [--threads 1 2] [--repeats 3] [Hydra overrides]

The default scene is ``python sim.py``'s (Fashion-MNIST, 100 IID clients, LeNet-5); the local block is
the strategy's ``train`` (FedCorr's stages 2-3 and FedAvg share it: CE, SGD momentum 0.5, batch 10, 5
epochs, lr 0.01). For K clients drawn as a round would draw them, every client's batches are first
materialised exactly as ``task.training.train_local`` draws them (the node's generator for the round:
one permutation per epoch, then the training augmentation per batch), so both contenders train on the
same tensors in the same order from the same global weights:

(a) sequential: one client after another, a plain PyTorch loop (``torch.optim.SGD``) over its batches;
(b) vectorised: the K clients at once, ``torch.func.stack_module_state`` + ``vmap(grad(...))`` over
    ``functional_call`` and a hand-written SGD-with-momentum update on the stacked parameters.

Unequal clients are padded and masked: step t of the stacked run is every client's t-th batch; a short
last batch is padded to the batch size with zero-weight rows (the loss is the weighted mean, which is
the mean over the real rows), and a client whose batches have run out gets a zero gradient and a
momentum/parameter update that leaves it unchanged. The padded share of the work is printed.

The equality check prints (b)'s drift from (a) after 5, 60 and all steps of a round beside (a)'s own
drift from the same training in float64: rounding differences grow over hundreds of SGD steps, so that
is the tolerance float32 itself allows. Also timed, for what surrounds training in our client:
``client.update.local_update`` on the same clients (our real path: model construction, augmentation on
the fly, hooks) and the augmentation alone. Every timing is the median of ``--repeats`` runs, (a) and
(b) interleaved so a shared machine's load hits both alike; the speed-up is also given by CPU time.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, stack_module_state, vmap  # noqa: E402

from client.node import LocalNode, load_node  # noqa: E402
from client.update import local_update  # noqa: E402
from common.validation import from_mapping  # noqa: E402
from data.scene import prepare_scene  # noqa: E402
from server.run import initial_arrays  # noqa: E402
from settings.compose import RUN_CONFIG_KEY, compose_config  # noqa: E402
from settings.run import run_settings  # noqa: E402
from task.batches import ImageBatches, label_tensor  # noqa: E402
from task.build import model_for_state  # noqa: E402
from task.hooks import TrainingHooks  # noqa: E402
from task.local_training import LocalTraining  # noqa: E402

State = dict[str, torch.Tensor]
Step = tuple[torch.Tensor, torch.Tensor]  # one batch: (network inputs, labels)
DEFAULT_OUT_DIR = "outputs/bench-vectorised"
# Layers whose train-mode behaviour is random or keeps running state: vmap needs care with them.
_RANDOM_LAYERS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
_STATEFUL_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm)


@dataclass(frozen=True)
class Setup:
    """What every measurement shares: the local training block, the global weights clients start
    from, a template network, and how to load a client's node."""

    training: LocalTraining
    global_state: State
    template: nn.Module
    num_clients: int
    run_config: dict[str, bool | float | int | str]
    description: str

    def node(self, partition_id: int) -> LocalNode:
        """Client ``partition_id``'s node, loaded as the ClientApp loads it (cached per process, so
        only the clients a measurement draws are ever read)."""
        return load_node(Context(run_id=1, node_id=partition_id, node_config={"partition-id": partition_id},
                                 state=RecordDict(), run_config=self.run_config))

    def round_nodes(self, k: int, seed: int) -> list[LocalNode]:
        """The nodes of K clients drawn as a round draws them."""
        return [self.node(c) for c in pick_clients(self.num_clients, k, seed)]


@dataclass(frozen=True)
class RoundBatches:
    """The K clients' batches of one round, stacked step-major so step t is one contiguous slice.

    inputs: (S, K, B, C, H, W) float32 network inputs (after the training augmentation);
    labels: (S, K, B) int64; counts: (S, K) real rows of each client's step t (0: it has no step t).
    S is the largest client's number of steps; a client's real steps come first.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    counts: torch.Tensor

    @property
    def clients(self) -> int:
        """K."""
        return int(self.counts.shape[1])

    def steps_of(self, client: int) -> int:
        """The number of real steps of ``client``."""
        return int((self.counts[:, client] > 0).sum())

    def padded_share(self) -> float:
        """The share of the stacked rows that are padding, i.e. work (b) does in vain."""
        return 1.0 - float(self.counts.sum()) / self.labels.numel()


def load_setup(overrides: Sequence[str]) -> Setup:
    """Compose the config, build (or reuse) the scene, and load every node as the ClientApp would."""
    cfg = compose_config(list(overrides))
    settings = run_settings(cfg)
    _, dataset, _ = prepare_scene(settings.scene, settings.out_dir)
    if "train" not in cfg.strategy:
        raise SystemExit(f"strategy {cfg.strategy.name} has no local training block to measure")
    # The train block alone: the bench needs no other strategy setting.
    training = from_mapping(LocalTraining, OmegaConf.to_container(cfg.strategy.train, resolve=True),
                            "strategy.train")
    if training.optimizer != "sgd" or training.weight_decay != 0 or training.learner != "ce":
        raise SystemExit("this bench vectorises plain SGD (momentum, no weight decay) with the ce learner")
    run_config: dict[str, bool | float | int | str] = {RUN_CONFIG_KEY: shlex.join(overrides)}
    global_state = initial_arrays(settings, dataset).to_torch_state_dict()
    template = model_for_state(settings.model, dataset, settings.transforms, global_state.keys())
    template.load_state_dict(global_state)
    description = (f"{dataset.name}, {settings.num_clients} clients ({settings.scene.partition.name}), "
                   f"{settings.model.name}, lr {training.lr}, momentum {training.momentum}, "
                   f"batch {training.batch_size}, {training.epochs} local epochs")
    return Setup(training, global_state, template, settings.num_clients, run_config, description)


def pick_clients(num_clients: int, k: int, seed: int) -> list[int]:
    """K distinct clients drawn uniformly, as a FedAvg round or a FedCorr stage 2-3 round draws them."""
    return sorted(int(c) for c in np.random.default_rng(seed).choice(num_clients, size=k, replace=False))


def client_steps(node: LocalNode, training: LocalTraining, server_round: int) -> list[Step]:
    """One client's (inputs, labels) per step, drawn as ``train_local`` draws them from the node's
    generator for ``server_round``: a permutation per epoch, then the augmentation of each batch."""
    generator = node.generator(server_round)
    images = ImageBatches(node.data.images, "cpu")
    targets = label_tensor(node.data.labels, len(images))
    steps = []
    for _ in range(training.epochs):
        order = torch.randperm(len(images), generator=generator)
        for rows in order.split(training.batch_size):
            steps.append((node.train_transform(images(rows), generator), targets[rows]))
    return steps


def round_batches(nodes: Sequence[LocalNode], training: LocalTraining, server_round: int) -> RoundBatches:
    """The clients' steps stacked step-major, short batches and missing steps padded with zeros."""
    per_client = [client_steps(node, training, server_round) for node in nodes]
    num_steps = max(len(steps) for steps in per_client)
    sample_shape = per_client[0][0][0].shape[1:]
    shape = (num_steps, len(nodes), training.batch_size)
    inputs = torch.zeros(*shape, *sample_shape)
    labels = torch.zeros(shape, dtype=torch.long)
    counts = torch.zeros(shape[:2], dtype=torch.long)
    for k, steps in enumerate(per_client):
        for t, (x, y) in enumerate(steps):
            inputs[t, k, : len(y)] = x
            labels[t, k, : len(y)] = y
            counts[t, k] = len(y)
    return RoundBatches(inputs, labels, counts)


def train_sequential(template: nn.Module, global_state: State, batches: RoundBatches,
                     training: LocalTraining) -> list[State]:
    """(a) Each client in turn: a fresh copy of the global model, torch's SGD, its real rows only."""
    states = []
    for k in range(batches.clients):
        model = copy.deepcopy(template)
        model.load_state_dict(global_state)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=training.lr, momentum=training.momentum)
        for t in range(batches.steps_of(k)):
            n = int(batches.counts[t, k])
            loss = F.cross_entropy(model(batches.inputs[t, k, :n]), batches.labels[t, k, :n])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        states.append({key: value.detach().clone() for key, value in model.state_dict().items()})
    return states


def masked_loss_fn(template: nn.Module) -> Callable[..., torch.Tensor]:
    """One client's loss on one padded batch from its parameters: the CE averaged over the rows whose
    weight is 1 (0 when it has none, so a finished client's gradient is zero)."""
    base = copy.deepcopy(template).to("meta")

    def loss(params: State, buffers: State, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        logits = functional_call(base, (params, buffers), (x,))
        per_row = F.cross_entropy(logits, y, reduction="none")
        return (per_row * w).sum() / w.sum().clamp(min=1.0)

    return loss


def train_vectorised(template: nn.Module, global_state: State, batches: RoundBatches,
                     training: LocalTraining) -> list[State]:
    """(b) All K clients at once: per-client gradients from one ``vmap(grad(loss))`` call per step, then
    SGD with momentum (torch's rule, dampening 0: buf = m * buf + g; w -= lr * buf) on the stacked
    parameters. A client without step t keeps its buffer and weights (coefficient 1, step size 0)."""
    k = batches.clients
    models = [copy.deepcopy(template) for _ in range(k)]
    for model in models:
        model.load_state_dict(global_state)
    params, buffers = stack_module_state(models)
    params = {name: p.detach() for name, p in params.items()}
    momentum = {name: torch.zeros_like(p) for name, p in params.items()}
    per_client_grad = vmap(grad(masked_loss_fn(template)), in_dims=(0, 0, 0, 0, 0))
    rows = torch.arange(batches.labels.shape[-1])
    for t in range(batches.counts.shape[0]):
        counts = batches.counts[t]
        weights = (rows < counts[:, None]).float()
        grads = per_client_grad(params, buffers, batches.inputs[t], batches.labels[t], weights)
        if bool((counts > 0).all()):
            for name, p in params.items():
                momentum[name].mul_(training.momentum).add_(grads[name])
                p.add_(momentum[name], alpha=-training.lr)
        else:
            active = (counts > 0).float()
            keep = training.momentum * active + (1.0 - active)
            for name, p in params.items():
                view = (k,) + (1,) * (p.dim() - 1)
                momentum[name].mul_(keep.view(view)).add_(grads[name])
                p.sub_(momentum[name] * (training.lr * active).view(view))
    return [{**{n: p[c].clone() for n, p in params.items()}, **{n: b[c].clone() for n, b in buffers.items()}}
            for c in range(k)]


def max_abs_difference(first: Sequence[State], second: Sequence[State]) -> float:
    """The largest |difference| over every client and every tensor of two lists of states."""
    return max(float((a[key].float() - b[key].float()).abs().max()) for a, b in zip(first, second) for key in a)


def our_client_updates(nodes: Sequence[LocalNode], setup: Setup, server_round: int) -> list[State]:
    """The clients trained by our real client path, ``client.update.local_update`` (what the ClientApp
    runs for FedAvg and FedCorr stages 2-3)."""
    states = []
    for node in nodes:
        model, _ = local_update(node, setup.global_state, TrainingHooks(setup.training), server_round)
        states.append({key: value.detach().clone() for key, value in model.state_dict().items()})
    return states


@dataclass(frozen=True)
class Timing:
    """Median seconds of one run: wall clock, and this process's CPU time (all its threads), which a
    shared machine's load disturbs far less than the wall clock."""

    wall: float
    cpu: float


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call of ``run``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def interleaved_medians(runs: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """Each run's median times over ``repeats`` rounds in which every run goes once, in turn, so a
    change in the machine's load is shared by all of them."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(timed(run))
    return {name: Timing(statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
            for name, values in times.items()}


def layer_report(model: nn.Module) -> str:
    """Which layers of ``model`` are random (dropout) or stateful (normalisation) in training: what
    vmap would need extra care for."""
    random_layers = [name for name, m in model.named_modules() if isinstance(m, _RANDOM_LAYERS)]
    stateful = [name for name, m in model.named_modules() if isinstance(m, _STATEFUL_LAYERS)]
    buffers = [name for name, _ in model.named_buffers()]
    return (f"dropout layers: {random_layers or 'none'}; normalisation layers: {stateful or 'none'}; "
            f"buffers: {buffers or 'none'}")


@dataclass(frozen=True)
class Row:
    """One line of the table: K clients at a thread count."""

    k: int
    threads: int
    sequential: Timing
    vectorised: Timing
    ours: Timing | None
    augment: Timing | None
    max_diff: float
    padded: float


def measure(setup: Setup, k: int, threads: int, repeats: int, server_round: int, seed: int) -> Row:
    """Time (a) and (b) for K clients at ``threads`` torch threads, after one untimed warm-up, and compare
    (b)'s final weights with (a)'s. At 1 thread (a simulated client's) also our client path and the
    augmentation alone."""
    torch.set_num_threads(threads)
    nodes = setup.round_nodes(k, seed)
    batches = round_batches(nodes, setup.training, server_round)
    sequential = train_sequential(setup.template, setup.global_state, batches, setup.training)
    vectorised = train_vectorised(setup.template, setup.global_state, batches, setup.training)
    runs: dict[str, Callable[[], object]] = {
        "a": lambda: train_sequential(setup.template, setup.global_state, batches, setup.training),
        "b": lambda: train_vectorised(setup.template, setup.global_state, batches, setup.training),
    }
    if threads == 1:
        runs["ours"] = lambda: our_client_updates(nodes, setup, server_round)
        runs["augment"] = lambda: [client_steps(node, setup.training, server_round) for node in nodes]
    times = interleaved_medians(runs, repeats)
    return Row(k, threads, times["a"], times["b"], times.get("ours"), times.get("augment"),
               max_abs_difference(sequential, vectorised), batches.padded_share())


def check_sequential_is_ours(setup: Setup, server_round: int, seed: int) -> float:
    """(a) on pre-drawn batches must be our client path's computation: the max |difference| of their
    final weights for two clients."""
    nodes = setup.round_nodes(2, seed)
    batches = round_batches(nodes, setup.training, server_round)
    sequential = train_sequential(setup.template, setup.global_state, batches, setup.training)
    return max_abs_difference(sequential, our_client_updates(nodes, setup, server_round))


def truncated(batches: RoundBatches, steps: int) -> RoundBatches:
    """The first ``steps`` steps of a round."""
    return RoundBatches(batches.inputs[:steps], batches.labels[:steps], batches.counts[:steps])


def in_float64(template: nn.Module, global_state: State, batches: RoundBatches) -> tuple[nn.Module, State,
                                                                                         RoundBatches]:
    """The template, the global weights and the inputs in float64: the reference for rounding."""
    state = {key: value.double() if value.is_floating_point() else value for key, value in global_state.items()}
    return copy.deepcopy(template).double(), state, RoundBatches(batches.inputs.double(), batches.labels,
                                                                  batches.counts)


def float_yardstick(setup: Setup, k: int, server_round: int, seed: int) -> str:
    """How far (b) drifts from (a) as steps accumulate, beside how far (a) itself drifts from the same
    training in float64: rounding differences grow over hundreds of SGD steps (a ReLU or max-pool tie
    goes the other way), so float tolerance after a round is what float32 itself achieves."""
    torch.set_num_threads(1)
    nodes = setup.round_nodes(k, seed)
    batches = round_batches(nodes, setup.training, server_round)
    drift = []
    for steps in (5, 60, batches.counts.shape[0]):
        part = truncated(batches, steps)
        a = train_sequential(setup.template, setup.global_state, part, setup.training)
        b = train_vectorised(setup.template, setup.global_state, part, setup.training)
        drift.append(f"{steps} steps {max_abs_difference(a, b):.1e}")
    reference = train_sequential(*in_float64(setup.template, setup.global_state, batches), setup.training)
    return (f"{k} clients, max |(b) - (a)| after {', '.join(drift)}; after the round, max |(a) - (a in float64)| "
            f"{max_abs_difference(a, reference):.1e} and max |(b) - (a in float64)| "
            f"{max_abs_difference(b, reference):.1e}")


def print_header() -> None:
    """The table's header: wall seconds per round (median), the speed-up of (b) over (a) by wall clock
    and by CPU time, and what surrounds training in our client."""
    print(f"{'thr':>3} {'K':>3} {'(a) seq s':>9} {'(b) vmap s':>10} {'speed-up':>8} {'cpu speed-up':>12} "
          f"{'max|a-b|':>9} {'ours s':>7} {'augment s':>9} {'padded':>6}")


def print_row(r: Row) -> None:
    """One measured line, printed as soon as it is measured."""
    print(f"{r.threads:>3} {r.k:>3} {r.sequential.wall:>9.3f} {r.vectorised.wall:>10.3f} "
          f"{r.sequential.wall / r.vectorised.wall:>7.2f}x {r.sequential.cpu / r.vectorised.cpu:>11.2f}x "
          f"{r.max_diff:>9.1e} {_seconds(r.ours):>7} {_seconds(r.augment):>9} {r.padded:>6.1%}", flush=True)


def _seconds(value: Timing | None) -> str:
    """A wall time for the table, or a dash when it was not measured."""
    return "-" if value is None else f"{value.wall:.3f}"


def main() -> None:
    """Parse the arguments, load the scene, measure every (threads, K) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 5, 10, 20], help="clients trained per round")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    parser.add_argument("--round", type=int, default=1, help="the server round the clients' generators use")
    parser.add_argument("--seed", type=int, default=0, help="seed of the client draw")
    parser.add_argument("overrides", nargs="*", default=[], help="Hydra overrides (default: sim.py's defaults)")
    args = parser.parse_args()
    overrides = list(args.overrides)
    if not any(o.startswith("out_dir=") for o in overrides):
        overrides.append(f"out_dir={DEFAULT_OUT_DIR}")
    torch.set_num_threads(1)
    setup = load_setup(overrides)
    print(setup.description)
    print(f"model: {layer_report(setup.template)}")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"(a) vs client.update.local_update, same 2 clients: max |diff| "
          f"{check_sequential_is_ours(setup, args.round, args.seed):.1e}")
    print(f"float tolerance: {float_yardstick(setup, 5, args.round, args.seed)}")
    print_header()
    for threads in args.threads:
        for k in args.ks:
            print_row(measure(setup, k, threads, args.repeats, args.round, args.seed))
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; medians of {args.repeats} runs")


if __name__ == "__main__":
    main()
