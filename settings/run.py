"""The run's settings below the strategy: scene, model, transforms, server, client and simulation.

``run_settings(cfg)`` checks the composed Hydra configuration once and returns frozen dataclasses;
every check lives in the dataclass that holds the value. The ServerApp adds the strategy's settings
on top (``server.config``); the ClientApp needs only these.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from common.errors import ConfigError, InvalidValue
from common.validation import (
    Choice,
    Flag,
    Integer,
    Nullable,
    Number,
    check_fields,
    rule,
    settings_from_mapping,
)
from data.scene import SceneSpec
from data.transforms import TransformPair, TransformSpec
from models import ModelSpec
from settings.scene import out_dir, resolved, scene_spec

ON_CLIENT_ERROR = ("fail", "skip")


@dataclass(frozen=True)
class ServerSettings:
    """How the ServerApp runs (``server`` in the config).

    eval_every: evaluate the global model on the test split every k rounds (and after the last).
    eval_batch_size: batch size of that evaluation.
    node_wait_timeout: seconds to wait for all ``num_clients`` nodes to connect.
    round_timeout: seconds a round (or a query) waits for client replies.
    on_client_error: ``fail`` stops the run naming the client; ``skip`` drops it from the round.
    device: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` for the central evaluation.
    """

    eval_every: int = field(default=1, metadata=rule(Integer(low=1)))
    eval_batch_size: int = field(default=500, metadata=rule(Integer(low=1)))
    node_wait_timeout: float = field(default=120.0, metadata=rule(Number(low=0.0, low_open=True)))
    round_timeout: float = field(default=600.0, metadata=rule(Number(low=0.0, low_open=True)))
    on_client_error: str = field(default="fail", metadata=rule(Choice(ON_CLIENT_ERROR)))
    device: str = "auto"

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class LoggingSettings:
    """What a run logs besides results.json (``logging`` in the config).

    tensorboard: live curves in ``<out_dir>/tensorboard`` (the optional ``tensorboard`` extra).
    """

    tensorboard: bool = field(default=False, metadata=rule(Flag()))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ClientSettings:
    """How a client node computes (``client`` in the config, threads from ``simulation``).

    device: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``.
    num_threads: torch threads of a simulated client (its Ray CPUs).
    """

    device: str = "auto"
    num_threads: int = field(default=1, metadata=rule(Integer(low=1)))

    def __post_init__(self) -> None:
        check_fields(self)


# Ray refuses a smaller object store (ray._private.ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES),
# but only once its runtime has started.
OBJECT_STORE_MINIMUM_BYTES = 78_643_200


@dataclass(frozen=True)
class SimulationSettings:
    """Flower's simulation engine on Ray (``simulation`` in the config).

    num_cpus_per_client: Ray CPUs per simulated client (> 0, at most what Ray has).
    num_gpus_per_client: Ray GPUs per client; fractions share one GPU (e.g. 0.25).
    ray_init_args: extra ``ray.init`` arguments.
    verbose: Flower's per-round INFO logs and Ray's actor output.
    """

    num_cpus_per_client: float = field(default=1.0, metadata=rule(Number(low=0.0, low_open=True)))
    num_gpus_per_client: float = field(default=0.0, metadata=rule(Number(low=0.0)))
    ray_init_args: dict[str, Any] = field(default_factory=dict)
    verbose: bool = field(default=False, metadata=rule(Flag()))

    def __post_init__(self) -> None:
        check_fields(self)
        if not isinstance(self.ray_init_args, dict):
            raise InvalidValue("ray_init_args", self.ray_init_args, "allowed is a mapping of ray.init arguments")
        # The values Ray would refuse only once its runtime has started. The keys' names (against
        # ray.init itself) and a cluster address are checked where Ray is imported
        # (server.simulation_engine.check_ray_init_args).
        for key, low in (("num_cpus", 0), ("num_gpus", 0), ("object_store_memory", OBJECT_STORE_MINIMUM_BYTES)):
            if key in self.ray_init_args:
                Integer(low=low).check(f"ray_init_args.{key}", self.ray_init_args[key])
        resources = self.ray_init_args.get("resources", {})
        if not isinstance(resources, dict) or not all(
                isinstance(amount, (int, float)) and not isinstance(amount, bool) and amount >= 0
                for amount in resources.values()):
            raise InvalidValue("ray_init_args.resources", resources,
                               "allowed is a mapping of resource names to amounts >= 0")
        # Asking for more than Ray has leaves the actor pool empty: Flower then fails only after the
        # ServerApp has started, and nothing can stop it waiting for replies.
        num_cpus = self.ray_init_args.get("num_cpus", os.cpu_count() or 1)
        Number(low=0.0, high=num_cpus, low_open=True).check("num_cpus_per_client", self.num_cpus_per_client)
        if self.num_gpus_per_client > 0:
            import torch  # only when GPUs are asked for: it is slow to import

            num_gpus = self.ray_init_args.get("num_gpus", torch.cuda.device_count())
            Number(low=0.0, high=num_gpus).check("num_gpus_per_client", self.num_gpus_per_client)


@dataclass(frozen=True)
class RunSettings:
    """One run, checked: everything but the strategy's own settings.

    seed: every random choice flows from it; num_clients: the federation's size.
    out_dir: where the run writes (scene.npz, results.json, rounds.csv).
    comm_budget: client participations every method spends (None: each strategy's own rounds).
    ground_truth: whether the server may read the scene's ground truth for detection and label-noise
        figures (simulation sets it; a deployed server has none unless the run says so).
    scene, model, transforms, server, logging, client, simulation: the parts, see their classes.
    resolved: the whole resolved configuration, as results.json stores it.
    """

    seed: int = field(metadata=rule(Integer(low=0)))
    num_clients: int = field(metadata=rule(Integer(low=1)))
    out_dir: str
    scene: SceneSpec
    model: ModelSpec
    transforms: TransformPair
    comm_budget: int | None = field(default=None, metadata=rule(Nullable(Integer(low=1))))
    ground_truth: bool = field(default=False, metadata=rule(Flag()))
    server: ServerSettings = field(default_factory=ServerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    simulation: SimulationSettings = field(default_factory=SimulationSettings)
    resolved: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(self)


def _transforms(cfg: dict[str, Any]) -> TransformPair:
    if not isinstance(cfg, dict) or set(cfg) != {"train", "eval"}:
        raise InvalidValue("dataset.transforms", cfg, "allowed is a mapping with keys train and eval")
    return TransformPair(*(settings_from_mapping(TransformSpec, cfg[part], f"dataset.transforms.{part}")
                           for part in ("train", "eval")))


def run_settings(cfg: DictConfig) -> RunSettings:
    """Check the composed configuration (all but ``strategy``) and return it as ``RunSettings``.

    Raises one ConfigError naming the first bad value and what is allowed.
    """
    values = resolved(cfg)
    transforms = _transforms(values["dataset"].get("transforms"))
    scene = scene_spec(values)
    model_cfg = dict(values["model"])
    model = ModelSpec(model_cfg.pop("name"), model_cfg)
    simulation = settings_from_mapping(SimulationSettings, values["simulation"], "simulation")
    client = settings_from_mapping(ClientSettings, values["client"], "client",
                                   num_threads=max(1, int(simulation.num_cpus_per_client)))
    try:
        return RunSettings(
            seed=values["seed"], num_clients=values["num_clients"], out_dir=out_dir(values),
            comm_budget=values.get("comm_budget"), ground_truth=values.get("ground_truth", False),
            scene=scene, model=model, transforms=transforms,
            server=settings_from_mapping(ServerSettings, values["server"], "server"),
            logging=settings_from_mapping(LoggingSettings, values.get("logging") or {}, "logging"),
            client=client, simulation=simulation, resolved=values,
        )
    except KeyError as err:
        raise ConfigError(f"{err.args[0]} is missing: the config must set it") from None
