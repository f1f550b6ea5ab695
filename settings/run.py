"""The run's settings below the strategy: scene, model, transforms, server, client and simulation.

``run_settings(cfg)`` checks the composed Hydra configuration once and returns frozen dataclasses;
every check lives in the dataclass that holds the value. The ServerApp adds the strategy's settings
on top (``server.config``); the ClientApp needs only these.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from common.errors import ConfigError, InvalidValue
from common.validation import Checked, Declared, Flag, FolderPath, Interval, Options, Pattern, from_mapping, option
from data.scene import SEED, SceneSpec
from data.transforms import TransformPair, TransformSpec
from models import ModelSpec
from settings.scene import out_dir, resolved, scene_spec

ON_CLIENT_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class ServerSettings(Checked):
    """How the ServerApp runs (``server`` in the config, threads from ``simulation``)."""

    eval_every: int = option(Interval(int, 1), "evaluate the global model every k rounds (and after each "
                                               "stage's last round and the run's last)")
    eval_batch_size: int = option(Interval(int, 1), "the batch size of that evaluation")
    node_wait_timeout: float = option(Interval(float, 0.0, closed="neither"),
                                      "seconds to wait for all num_clients nodes to connect")
    round_timeout: float = option(Interval(float, 0.0, closed="neither"),
                                  "seconds a round (or a query) waits for client replies")
    on_client_error: str = option(Options(ON_CLIENT_ERROR),
                                  "fail: stop the run naming the client | skip: drop it from the round")
    device: str = option(meaning="auto | cpu | cuda | cuda:N, for the central evaluation")
    checkpoint_every: int = option(Interval(int, 1), "write a checkpoint every k rounds (and at each stage's end)")
    keep_checkpoints: int = option(Interval(int, 1), "how many of the latest periodic checkpoints to keep")
    num_threads: int | None = option(Interval(int, 1, or_none=True),
                                     "torch threads of the central evaluation (the CPUs the run's own Ray is given; "
                                     "None: torch's default, every core)")


@dataclass(frozen=True)
class LoggingSettings(Checked):
    """What a run logs besides results.json (``logging`` in the config)."""

    tensorboard: bool = option(Flag(), "live curves in <out_dir>/tensorboard (the tensorboard extra)")
    mlflow: bool = option(Flag(), "live curves in an MLflow run (the mlflow extra)")
    mlflow_uri: str = option(Pattern(r"(sqlite:///|https?://|file:|databricks).+",
                                     "an MLflow tracking URI: sqlite:///<file>, http(s)://<host>, file:<folder> "
                                     "or databricks"), "the MLflow tracking store")
    mlflow_experiment: str = option(Pattern(r".*\S.*", "a name that is not blank"),
                                    "the MLflow experiment the run goes in")


@dataclass(frozen=True)
class ParticipationSettings(Checked):
    """Dynamic participation (``participation`` in the config): a share of the clients, drawn from the
    seed, takes part only from round ``join_round`` on."""

    late: float = option(Interval(float, 0.0, 1.0, closed="left"), "the share of clients that join late "
                                                                   "(0: every client from round 1)")
    join_round: int = option(Interval(int, 2), "the first round the late joiners may take part in")


@dataclass(frozen=True)
class ClientSettings(Checked):
    """How a client node computes (``client`` in the config, threads from ``simulation``)."""

    device: str = option(meaning="auto | cpu | cuda | cuda:N")
    num_threads: int = option(Interval(int, 1), "torch threads of a simulated client (its Ray CPUs)")


# Ray refuses a smaller object store (ray._private.ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES),
# but only once its runtime has started.
OBJECT_STORE_MINIMUM_BYTES = 78_643_200


@dataclass(frozen=True)
class RayAddress(Declared):
    """Where a simulation's Ray runs: ``auto`` (the cluster Ray finds: ``RAY_ADDRESS``, or the one
    ``ray start`` began on this machine), ``host:port`` or ``ray://host:port``; None: a Ray of its own."""

    or_none: bool = True

    def allowed(self) -> str:
        """``allowed are null, auto, host:port or ray://host:port``."""
        return "allowed are null (a local Ray of the run's own), auto, host:port or ray://host:port"

    def admits(self, value: Any) -> bool:
        """``auto``, or a host and a numeric port."""
        if value == "auto":
            return True
        host, _, port = str(value).removeprefix("ray://").rpartition(":") if isinstance(value, str) else ("", "", "")
        return bool(host) and port.isdigit()

    def refused(self) -> list[Any]:
        """A port without a host, a host without a port, and a number."""
        return [":6379", "localhost", 6379]


# How long a Ray cluster given by ``address`` may take to accept a connection before the run is refused.
ADDRESS_TIMEOUT_S = 5.0


def check_ray_address(key: str, address: str | None) -> None:
    """A ``host:port`` (or ``ray://host:port``) cluster address (its form checked with the settings)
    must accept a TCP connection: Ray itself retries an unreachable one for ever, ignoring SIGTERM.
    ``auto`` and None find or start a Ray as ray.init does."""
    if address is None or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=ADDRESS_TIMEOUT_S):
            pass
    except OSError as err:
        raise InvalidValue(key, address, f"a Ray cluster that answers; nothing accepted a connection there within "
                                         f"{ADDRESS_TIMEOUT_S:.0f} s ({err.strerror or err})") from None


@dataclass(frozen=True)
class SimulationSettings(Checked):
    """Flower's simulation engine on Ray (``simulation`` in the config)."""

    ray_address: str | None = option(RayAddress(), "null: start a Ray of the run's own | auto | host:port: "
                                                   "join that Ray cluster, whose nodes run the clients")
    num_cpus_per_client: float = option(Interval(float, 0.0, closed="neither"),
                                        "Ray CPUs per simulated client (at most what Ray has)")
    num_gpus_per_client: float = option(Interval(float, 0.0), "Ray GPUs per client; fractions share one GPU")
    ray_init_args: dict[str, Any] = option(meaning="extra ray.init arguments")
    verbose: bool = option(Flag(), "Flower's per-round INFO logs and Ray's actor output")

    def check(self) -> None:
        """The ``ray.init`` arguments Ray would refuse only once it runs, and resources that fit."""
        if not isinstance(self.ray_init_args, dict):
            raise InvalidValue("ray_init_args", self.ray_init_args, "allowed is a mapping of ray.init arguments")
        if "address" in self.ray_init_args:
            raise InvalidValue("ray_init_args.address", self.ray_init_args["address"],
                               "set simulation.ray_address instead (null, auto or host:port)")
        # The values Ray would refuse only once its runtime has started. The keys' names (against
        # ray.init itself) and a cluster address are checked where Ray is imported
        # (server.simulation_engine.check_ray_init_args).
        for key, low in (("num_cpus", 0), ("num_gpus", 0), ("object_store_memory", OBJECT_STORE_MINIMUM_BYTES)):
            if key in self.ray_init_args:
                Interval(int, low).check(f"ray_init_args.{key}", self.ray_init_args[key])
        resources = self.ray_init_args.get("resources", {})
        if not isinstance(resources, dict) or not all(
                isinstance(amount, (int, float)) and not isinstance(amount, bool) and amount >= 0
                for amount in resources.values()):
            raise InvalidValue("ray_init_args.resources", resources,
                               "allowed is a mapping of resource names to amounts >= 0")
        if self.ray_address is not None:
            return  # a cluster's nodes, not this machine, hold the resources (checked once joined)
        # Asking for more than Ray has leaves the actor pool empty: Flower then fails only after the
        # ServerApp has started, and nothing can stop it waiting for replies.
        num_cpus = self.ray_init_args.get("num_cpus", os.cpu_count() or 1)
        Interval(float, 0.0, num_cpus, closed="right").check("num_cpus_per_client", self.num_cpus_per_client)
        if self.num_gpus_per_client > 0:
            import torch  # only when GPUs are asked for: it is slow to import

            num_gpus = self.ray_init_args.get("num_gpus", torch.cuda.device_count())
            Interval(float, 0.0, num_gpus).check("num_gpus_per_client", self.num_gpus_per_client)


@dataclass(frozen=True)
class RunSettings(Checked):
    """One run, checked: everything but the strategy's own settings. ``resolved`` is the whole
    resolved configuration, as results.json stores it."""

    seed: int = option(SEED, "every random choice flows from it")
    num_clients: int = option(Interval(int, 1), "the federation's size")
    out_dir: str = option(meaning="where the run writes (scene.npz, results.json, rounds.csv)")
    scene: SceneSpec = option(meaning="the data, its partition and its noise")
    model: ModelSpec = option(meaning="the network")
    transforms: TransformPair = option(meaning="the training and evaluation transforms")
    comm_budget: int | None = option(Interval(int, 1, or_none=True),
                                     "client participations every method spends (null: each strategy's own rounds)")
    ground_truth: bool = option(Flag(), "whether the server may read the scene's ground truth")
    resume: bool = option(Flag(), "continue the run in out_dir from its last checkpoint (false: start over)")
    replace: bool = option(Flag(), "whether the run may replace another run's results in out_dir")
    extend_from: str | None = option(FolderPath(or_none=True),
                                     "a finished run of this config at a smaller comm_budget to continue from")
    server: ServerSettings = option(meaning="how the ServerApp runs")
    participation: ParticipationSettings = option(meaning="which clients take part from which round")
    logging: LoggingSettings = option(meaning="what a run logs besides results.json")
    client: ClientSettings = option(meaning="how a client node computes")
    simulation: SimulationSettings = option(meaning="Flower's simulation engine on Ray")
    resolved: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def _anchor(path: str | None, folder: str) -> str | None:
    if path is None or Path(path).expanduser().is_absolute():
        return path
    return str(Path(folder) / path)


def anchored(settings: RunSettings, folder: str) -> RunSettings:
    """``settings`` with its relative paths (out_dir, the dataset's root and cache) taken relative to
    ``folder`` rather than this process's working folder: a simulated client that Ray starts on
    another node of a cluster begins in that node's own folder."""
    dataset = settings.scene.dataset
    dataset = replace(dataset, root=_anchor(dataset.root, folder), cache_dir=_anchor(dataset.cache_dir, folder))
    out = _anchor(settings.out_dir, folder)
    assert out is not None
    return replace(settings, out_dir=out, scene=replace(settings.scene, dataset=dataset))


def _transforms(cfg: dict[str, Any]) -> TransformPair:
    if not isinstance(cfg, dict) or set(cfg) != {"train", "eval"}:
        raise InvalidValue("dataset.transforms", cfg, "allowed is a mapping with keys train and eval")
    return TransformPair(*(from_mapping(TransformSpec, cfg[part], f"dataset.transforms.{part}")
                           for part in ("train", "eval")))


def _server_threads(simulation: SimulationSettings) -> int | None:
    """A run whose own Ray is given k CPUs evaluates on k torch threads: where several runs share a
    machine (``--jobs``, concurrent benchmarks), torch's default of every core makes their threads
    spin waiting on one another (some four times the CPU of one thread per evaluation on 2 cores). A
    run that joins a cluster, or whose Ray takes every core, keeps torch's default (None)."""
    num_cpus = simulation.ray_init_args.get("num_cpus")
    return None if num_cpus is None or simulation.ray_address is not None else int(num_cpus)


def run_settings(cfg: DictConfig | dict[str, Any]) -> RunSettings:
    """Check the composed configuration (all but ``strategy``) and return it as ``RunSettings``.

    Raises one ConfigError naming the first bad value and what is allowed.
    """
    values = resolved(cfg)
    transforms = _transforms(values["dataset"].get("transforms"))
    scene = scene_spec(values)
    model_cfg = dict(values["model"])
    model = ModelSpec(model_cfg.pop("name"), model_cfg)
    simulation = from_mapping(SimulationSettings, values["simulation"], "simulation")
    client = from_mapping(ClientSettings, values["client"], "client",
                          num_threads=max(1, int(simulation.num_cpus_per_client)))
    try:
        return RunSettings(
            seed=values["seed"], num_clients=values["num_clients"], out_dir=out_dir(values),
            comm_budget=values.get("comm_budget"), ground_truth=values.get("ground_truth", False),
            resume=values["resume"], replace=values["replace"], extend_from=values.get("extend_from"),
            scene=scene, model=model, transforms=transforms,
            server=from_mapping(ServerSettings, values["server"], "server", num_threads=_server_threads(simulation)),
            participation=from_mapping(ParticipationSettings, values["participation"], "participation"),
            logging=from_mapping(LoggingSettings, values["logging"], "logging"),
            client=client, simulation=simulation, resolved=values,
        )
    except KeyError as err:
        raise ConfigError(f"{err.args[0]} is missing: the config must set it") from None
