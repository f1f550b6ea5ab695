"""Where a round's time goes: one FedAvg round and one FedCorr stage-1 round of the default scene,
broken down into client compute, data access, model construction, message coding, aggregation,
central evaluation, results writing, checkpoints and Ray transfer.

    .venv/bin/python bench/profile_round.py [--fedavg-rounds 10] [--skip-sim] [Hydra overrides]

Each method runs twice with the same seed: once through the real ServerApp code (``run_server``)
and the real ClientApp (``client.app.app``) in this process, with a timer around the real
functions (each part's time excludes the timed calls nested in it), and once as the Flower
simulation on Ray (``sim.run``). FedAvg runs ``--fedavg-rounds`` rounds each way; FedCorr runs
one stage-1 iteration (``t1=1``, no stages 2-3: N rounds of one client each), in process only its
first ``--fedcorr-rounds``. Rounds 2.. are averaged (round 1 loads each node's data). A round's
wall time on Ray is the in-process parts with the clients' parts spread over the Ray actors, plus
what Ray adds: that remainder is the "Ray transfer" row.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import sim  # noqa: E402
from server.config import load_run  # noqa: E402
from server.run import RoundReporter, run_server  # noqa: E402
from settings.compose import compose_config  # noqa: E402
from task.device import torch_threads  # noqa: E402

OUR_PACKAGES = ("client", "server", "strategies", "protocol", "task", "settings", "data", "models", "common")
CLIENT_REST = "client: handlers, state, rest"
SERVER_REST = "server: strategy, Flower records, rest"
RAY = "Ray transfer (simulation - parts)"


@dataclass(frozen=True)
class Part:
    """A row of the table: the functions timed as it, and whether it runs on the clients."""

    name: str
    client: bool
    targets: tuple[str, ...]
    """``module:attribute`` or ``module:Class.method`` of each real function timed."""


PARTS = (
    Part("client compute: training", True, ("task.training:train_local",)),
    Part("client compute: per-sample losses", True, ("task.evaluation:loss_and_proba",)),
    Part("client compute: LID", True, ("task.lid:lid_score",)),
    Part("data access", True, ("client.node:load_node", "client.label_state:current_labels",
                               "client.label_state:store_local_losses", "client.state_store:enter",
                               "task.batches:ImageBatches.__init__")),
    Part("model construction", True, ("task.build:model_for", "torch.nn:Module.load_state_dict")),
    Part("message coding", True, ("protocol.messages:reply", "protocol.messages:read_arrays",
                                  "protocol.messages:read_instruction", "protocol.messages:read_plugin_ins",
                                  "client.update:cpu_state", "flwr.app:ArrayRecord.__init__",
                                  "flwr.app:ArrayRecord.to_torch_state_dict")),
    Part("aggregation", False, ("strategies.fedavg:average_arrays",)),
    Part("central evaluation", False, ("server.evaluation:CentralEvaluator.__call__",)),
    Part("results writing", False, ("server.results:ResultsWriter.add_round", "server.progress:Progress.update")),
    Part("checkpoints", False, ("server.checkpoints:CheckpointStore.write",)),
)


class Timers:
    """Exclusive time per part: a timed call's seconds minus those of the timed calls inside it."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []  # child seconds of each open call

    def call(self, part: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``fn`` and add its exclusive seconds to ``part``."""
        self._stack.append(0.0)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            children = self._stack.pop()
            self.totals[part] += elapsed - children
            if self._stack:
                self._stack[-1] += elapsed

    def snapshot(self) -> dict[str, float]:
        """The totals so far."""
        return dict(self.totals)


def _timed(timers: Timers, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        return timers.call(part, fn, args, kwargs)

    return timed


def instrument(timers: Timers, part: str, target: str) -> None:
    """Time the real function ``target`` as ``part``: a method on its class; a module function in
    its module and wherever our packages imported it by name."""
    module_name, attribute = target.split(":")
    owner: Any = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    *classes, name = attribute.split(".")
    for cls in classes:
        owner = getattr(owner, cls)
    original = getattr(owner, name)
    wrapped = _timed(timers, part, original)
    setattr(owner, name, wrapped)
    if classes:
        return
    for loaded, module in list(sys.modules.items()):
        if loaded.split(".")[0] in OUR_PACKAGES and getattr(module, name, None) is original:
            setattr(module, name, wrapped)


class InProcessGrid(Grid):
    """Delivers each message straight to the real ClientApp in this process (no copies, no Ray),
    one node after another; node k holds partition k and keeps its Context across messages. Clients
    compute with a simulated client's ``threads``, the server with the process's own."""

    def __init__(self, handler: Callable[[Message, Context], Message], timers: Timers, num_nodes: int,
                 run_config: Mapping[str, str], threads: int) -> None:
        self.handler = handler
        self.threads = threads
        self.timers = timers
        self.contexts = {pid + 1: Context(run_id=1, node_id=pid + 1, state=RecordDict(), run_config=dict(run_config),
                                          node_config={"partition-id": pid, "num-partitions": num_nodes})
                         for pid in range(num_nodes)}
        self._run = Run.create_empty(run_id=1)

    @property
    def run(self) -> Run:
        """The run the grid serves."""
        return self._run

    def set_run(self, run: Run) -> None:
        """Serve ``run``."""
        self._run = run

    def get_node_ids(self) -> Iterable[int]:
        """Every node's id."""
        return list(self.contexts)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """A message to ``dst_node_id``."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Not used: see ``send_and_receive``."""
        raise NotImplementedError("the strategies use send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Not used: see ``send_and_receive``."""
        raise NotImplementedError("the strategies use send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Each message's reply from its node's ClientApp call (timed as the client's rest)."""
        replies = []
        with torch_threads(self.threads):
            for message in messages:
                context = self.contexts[message.metadata.dst_node_id]
                replies.append(self.timers.call(CLIENT_REST, self.handler, (message, context), {}))
        return replies


def with_truth(overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """The composed config of ``overrides`` with the simulation's ``ground_truth=true``."""
    return sim.with_ground_truth(compose_config(overrides), overrides)


def with_identity(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``work()`` with the task identity Flower's runtime gives an app's process (messages carry it),
    restored afterwards so the simulation sets its own."""
    names = ("_run_id", "_task_id", "_node_id")
    before = [getattr(TaskIdentity, name) for name in names]
    for name, value in zip(names, (1, 2, 3)):
        setattr(TaskIdentity, name, value)
    try:
        return work()
    finally:
        for name, value in zip(names, before):
            setattr(TaskIdentity, name, value)


class Enough(Exception):
    """Raised after the last round to profile: the rest of the run is not needed."""


class Profiler:
    """Times every part of ``PARTS`` in this process (instrumented once) and marks each round's end."""

    def __init__(self) -> None:
        from client.app import app as client_app  # imported first: instrument() patches the loaded modules

        self.client_app = client_app
        self.timers = Timers()
        for part in PARTS:
            for target in part.targets:
                instrument(self.timers, part.name, target)
        self.marks: list[tuple[float, dict[str, float]]] = []
        self.limit = 0
        self.clients = 0
        report = RoundReporter.__call__

        def observed(reporter: RoundReporter, *args: Any) -> Any:
            result = report(reporter, *args)
            self.clients = len(args[0].clients)
            self.marks.append((time.perf_counter(), self.timers.snapshot()))
            if len(self.marks) == self.limit:
                raise Enough
            return result

        RoundReporter.__call__ = observed  # type: ignore[method-assign,assignment]

    def run(self, overrides: list[str], limit: int) -> tuple[dict[str, float], float, int]:
        """Run ``overrides`` in process for ``limit`` rounds; returns each part's seconds per round
        and the wall seconds per round over rounds 2.., and the clients of the last round."""
        cfg, overrides = with_truth(overrides)
        plan = load_run(cfg)
        grid = InProcessGrid(self.client_app, self.timers, plan.settings.num_clients,
                             {"overrides": shlex.join(overrides)}, plan.settings.client.num_threads)
        self.marks.clear()
        self.limit = limit
        try:
            with_identity(lambda: run_server(grid, plan))
        except Enough:
            pass
        (first_t, first), (last_t, last) = self.marks[0], self.marks[-1]
        rounds = len(self.marks) - 1
        parts = {part: (last.get(part, 0.0) - first.get(part, 0.0)) / rounds for part in last}
        return parts, (last_t - first_t) / rounds, self.clients


def simulation_round(overrides: list[str]) -> float:
    """The simulation's wall seconds per round over rounds 2.. (from results.json's ``elapsed_s``)."""
    cfg, overrides = with_truth(overrides)
    rows = sim.run(cfg, overrides)["rounds"]
    return (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / (len(rows) - 1)


def table(title: str, parts: dict[str, float], wall: float, sim_wall: float | None, actors: int) -> str:
    """The breakdown: seconds of work per round per part, and its share of the simulation's round
    (the clients' parts run on ``actors`` Ray actors at once), Ray's remainder last."""
    client = {part.name for part in PARTS if part.client} | {CLIENT_REST}
    rows = {**parts, SERVER_REST: wall - sum(parts.values())}
    spread = {name: seconds / actors if name in client else seconds for name, seconds in rows.items()}
    total = sim_wall if sim_wall is not None else sum(spread.values())
    if sim_wall is not None:
        rows[RAY] = spread[RAY] = sim_wall - sum(spread.values())
    lines = [title, f"  {'part':<40} {'s/round':>8} {'share':>7}"]
    order = [part.name for part in PARTS] + [CLIENT_REST, SERVER_REST, RAY]
    lines += [f"  {name:<40} {rows[name]:8.3f} {spread[name] / total:7.1%}" for name in order if name in rows]
    lines.append(f"  {'in-process round (wall)':<40} {wall:8.3f}")
    if sim_wall is not None:
        lines.append(f"  {'simulation round (wall)':<40} {sim_wall:8.3f}   ({actors} Ray actors)")
    return "\n".join(lines)


def main() -> None:
    """Profile a FedAvg round and a FedCorr stage-1 round and print both tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fedavg-rounds", type=int, default=5)
    parser.add_argument("--fedcorr-rounds", type=int, default=20,
                        help="stage-1 rounds profiled in process (the simulation runs the whole iteration)")
    parser.add_argument("--skip-sim", action="store_true", help="only the in-process profile (no Ray)")
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    runs = {
        "FedAvg round": [*args.overrides, "strategy=fedavg", f"strategy.num_rounds={args.fedavg_rounds}"],
        "FedCorr stage-1 round": [*args.overrides, "strategy=fedcorr", "strategy.t1=1", "strategy.t2=0",
                                  "strategy.t3=0"],
    }
    profiler = Profiler()
    for title, overrides in runs.items():
        cfg = compose_config(overrides)
        name = title.split()[0].lower()
        limit = args.fedavg_rounds if name == "fedavg" else args.fedcorr_rounds
        parts, wall, clients = profiler.run([*overrides, f"out_dir=outputs/bench-profile/{name}-inproc"], limit)
        sim_out = f"out_dir=outputs/bench-profile/{name}-sim"
        sim_wall = None if args.skip_sim else simulation_round([*overrides, sim_out])
        actors = max(1, int((os.cpu_count() or 1) // cfg.simulation.num_cpus_per_client))
        print(table(f"{title} ({cfg.dataset.name}, {cfg.num_clients} clients, {cfg.model.name}, "
                    f"{clients} client(s) per round; mean of rounds 2-{len(profiler.marks)})",
                    parts, wall, sim_wall, max(1, min(actors, clients))), flush=True)

if __name__ == "__main__":
    main()
