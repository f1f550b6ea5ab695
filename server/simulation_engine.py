"""Run a ServerApp and its ClientApps in this process on Flower's simulation runtime (Ray backend)."""

from __future__ import annotations

import contextlib
import inspect
import os
import secrets
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ray
import tomli_w
from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from common.errors import ConfigError, InvalidValue
from common.validation import Interval
from settings.run import SimulationSettings

RunConfig = dict[str, bool | int | float | str]

_RUN_CONFIG_TYPES = (bool, int, float, str)


def check_ray_init_args(args: Mapping[str, Any]) -> None:
    """Every key of ``simulation.ray_init_args`` must be a named argument of ``ray.init`` (anything else
    goes to its ``**kwargs``, Ray's internal options, where an unknown key fails only after several
    tracebacks and leaves the runtime waiting). Their values are checked with the settings
    (``settings.run.SimulationSettings``)."""
    named = [name for name, parameter in inspect.signature(ray.init).parameters.items()
             if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    for key, value in args.items():
        if key not in named:
            raise InvalidValue(f"simulation.ray_init_args.{key}", value,
                               f"not an argument of ray.init; allowed are {', '.join(named)}")


def run_simulation_engine(
    server_app: ServerApp,
    client_app: ClientApp,
    *,
    num_supernodes: int,
    run_config: RunConfig,
    simulation: SimulationSettings,
    check_nodes: Callable[[str], None] | None = None,
) -> None:
    """Run ``server_app`` against ``num_supernodes`` virtual SuperNodes and return when it finishes.

    Both apps see ``run_config`` as ``context.run_config``; each ClientApp also sees
    ``context.node_config`` = {"partition-id": 0..num_supernodes-1, "num-partitions": num_supernodes}.
    ``simulation`` (checked when it was built) sets each client's Ray resources, extra ``ray.init``
    arguments and verbosity. Ray runs as many ClientApp actors as fit those resources; the
    actors live for the whole run and serve any node, so module-level caches in a ClientApp module
    survive between messages but are shared by the partitions one actor happens to serve.

    Nodes register just after the ServerApp starts: its main must wait until ``grid.get_node_ids()``
    holds all ``num_supernodes`` nodes, and should pass a ``timeout`` to ``grid.send_and_receive``.

    Errors:
      - bad arguments raise ConfigError before Ray starts (resources that cannot fit one actor are
        refused when ``SimulationSettings`` is built);
      - an exception raised in the ServerApp's main is re-raised here unchanged;
      - an exception raised in a ClientApp does not stop the run: the server gets a reply with
        ``reply.has_error()`` true and no content, ``reply.error.code`` equal to
        ``ErrorCode.CLIENT_APP_RAISED_EXCEPTION`` (``flwr.common.constant``) and the exception's
        message and traceback inside ``reply.error.reason``; the failed call leaves the node's
        context as it was;
      - a failure of the runtime itself, Ray's start included, raises RuntimeError (its cause: the
        failure); the ServerApp thread it leaves behind runs on until its own waits time out, which
        is why resources that cannot fit one actor are refused up front.

    ``simulation.ray_address`` None starts a Ray of the run's own on this machine, even where a cluster
    runs here (``address="local"``: Ray would otherwise join it). An address joins that cluster: the
    clients' actors are spread over its nodes, and ``check_nodes(address)`` runs once joined, before
    the first round (``server.cluster.check_nodes``: every node reads the data and the scene).

    Ray is started with ``simulation.ray_init_args`` over quiet defaults (no dashboard, Ray logs at ERROR and
    actor output hidden unless ``verbose``) and is shut down on return, also after an error. If Ray
    is already running, the run reuses it, so ``ray_init_args`` do not apply, and still shuts it down.
    """
    check_ray_init_args(simulation.ray_init_args)
    verbose = simulation.verbose
    init_args = {
        "address": simulation.ray_address or "local",
        "include_dashboard": False,
        "logging_level": "INFO" if verbose else "ERROR",
        "log_to_driver": verbose,
        **simulation.ray_init_args,
    }
    _check_arguments(num_supernodes, run_config)
    backend_config = {
        "client_resources": {"num_cpus": float(simulation.num_cpus_per_client),
                             "num_gpus": float(simulation.num_gpus_per_client)},
        "init_args": init_args,
    }
    try:
        with warnings.catch_warnings():
            # Ray's advice about a future change of CUDA_VISIBLE_DEVICES for num_gpus=0 actors;
            # the current behaviour (actors without GPUs see none) is the one we want.
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
            if not ray.is_initialized():
                _start_ray(init_args)
            if simulation.ray_address is not None and check_nodes is not None:
                check_nodes(simulation.ray_address)
            _run_flower_simulation(server_app, client_app, num_supernodes, dict(run_config), backend_config, verbose)
    finally:
        # Flower shuts Ray down itself unless it fails (or is interrupted) between starting Ray and building
        # the actor pool; Ray's shutdown also stops the processes of a start that was cut short.
        ray.shutdown()


def _start_ray(init_args: Mapping[str, Any]) -> None:
    """Start (or join) Ray here rather than let Flower do it, the same way and from the same thread, so
    that a SIGTERM handler of the command's own (server.interrupt), which ray.init replaces with one
    that does not mute Flower's log, is put back before the first round, and a cluster's nodes can be
    checked first. Without a handler of the command's own, Ray's stays: it unwinds the run. A Ray that
    does not start is a failure of the runtime (RuntimeError), as when Flower starts it.

    The workers get this process's import path, as Flower gives them. A Ray of the run's own starts its
    processes from this one, so they inherit it through the environment (set for the start only);
    Flower's runtime environment, which a cluster's nodes need, would make each worker wait for Ray's
    runtime-env agent instead (some 2 s more per run on 2 cores)."""
    handler = signal.getsignal(signal.SIGTERM)
    path = os.pathsep.join(sys.path)
    try:
        if init_args["address"] == "local":
            with _environment("PYTHONPATH", path):
                ray.init(**init_args)
        else:
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}}, **init_args)
    except Exception as err:
        raise RuntimeError("Ray did not start") from err
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block, as it was after it."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _check_arguments(num_supernodes: int, run_config: RunConfig) -> None:
    """Raise ConfigError for the first bad argument."""
    Interval(int, 1).check("num_supernodes", num_supernodes)
    if not isinstance(run_config, dict):
        raise ConfigError(f"run_config={run_config!r} is invalid: allowed is a dict of str to bool/int/float/str")
    for key, value in run_config.items():
        if not isinstance(key, str) or not isinstance(value, _RUN_CONFIG_TYPES):
            raise ConfigError(
                f"run_config[{key!r}]={value!r} is invalid: allowed are str keys with bool, int, float or str values"
            )


def _run_flower_simulation(
    server_app: ServerApp,
    client_app: ClientApp,
    num_supernodes: int,
    run_config: RunConfig,
    backend_config: dict[str, Any],
    verbose: bool,
) -> None:
    """Call Flower's simulation runtime the way its own ``flwr-simulation`` process does.

    The only place that touches Flower internals: run against flwr 1.41.0; the 1.42.0 sources of
    every module used here are identical (the pin is >=1.41,<1.43).
    ``flwr.simulation.run_simulation`` is deprecated and gives both apps an empty run config, so we
    call the private ``_run_simulation`` with what ``flwr.simulation.app.run_simulation_process``
    passes it: a registered ``Run``, the ServerApp's ``Context`` carrying the run config, and an app
    directory whose pyproject.toml ``[tool.flwr.app.config]`` is where ClientApp contexts take their
    run config from (``DeprecatedRunInfoStore.register_context`` with ``is_app=True``).
    """
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    # Run and task ids only label this in-memory run; Flower draws them at random the same way.
    run = Run.create_empty(run_id=secrets.randbelow(2**64 - 1) + 1)
    run.primary_task_id = secrets.randbelow(2**64 - 1) + 1
    run.federation_id = NOOP_FEDERATION_ID
    run.override_config = dict(run_config)
    # Message() stamps new instructions with this process-wide identity; the link state only
    # accepts them from the SuperLink node of a registered run.
    TaskIdentity.run_id = run.run_id
    TaskIdentity.task_id = run.primary_task_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    server_context = Context(
        run_id=run.run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    with tempfile.TemporaryDirectory(prefix="flwr-app-") as app_dir:
        app = {
            "publisher": "local",
            # Never loaded: both apps are passed as objects.
            "components": {"serverapp": "unused:server_app", "clientapp": "unused:client_app"},
            "config": run_config,
        }
        pyproject = {"project": {"name": "in-process-app", "version": "0.0.0"}, "tool": {"flwr": {"app": app}}}
        (Path(app_dir) / "pyproject.toml").write_text(tomli_w.dumps(pyproject), encoding="utf-8")
        _run_simulation(
            num_supernodes=num_supernodes,
            exit_event=EventType.PYTHON_API_RUN_SIMULATION_LEAVE,
            client_app=client_app,
            server_app=server_app,
            backend_name="ray",
            backend_config=backend_config,
            server_app_context=server_context,
            app_dir=app_dir,
            run=run,
            verbose_logging=verbose,
            is_app=True,
        )
