"""Run a federated experiment as a Flower simulation on Ray.

    python sim.py [Hydra overrides]            e.g. python sim.py experiment=smoke strategy=fedavg seed=2
    python sim.py -m seed=1,2,3                 a Hydra multirun, one simulation per seed
    python sim.py -m seed=1,2,3 --jobs 2        the same jobs, two at a time as separate processes
    python sim.py -m seed=1,2,3 --jobs 8 --cluster auto    as tasks on a Ray cluster (docs/cluster.md)

Composes conf/, checks every value once (``server.config.load_run``) before anything starts, builds
(or reuses) the scene in <out_dir>/scene.npz, runs the ServerApp and one virtual SuperNode per client
through Flower's simulation engine with the Ray backend, and prints a summary. A simulation knows its
ground truth, so ``ground_truth=true`` unless overridden. Results: <out_dir>/results.json and
<out_dir>/rounds.csv.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

# Flower reports usage to its servers by default; a research run should not phone home.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def _stopped_before_start(signum: int, frame: FrameType | None) -> None:
    print("stopped by Ctrl-C before the run started; nothing was written", file=sys.stderr)
    os._exit(130)


# Ctrl-C while the imports and the checks run (a few seconds) ends the command in one line; the run's
# own handling (server.interrupt) takes over when it starts. A SIGINT ignored by whoever started the
# command (a background job of a script) stays ignored.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, _stopped_before_start)

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from common.errors import ConfigError, InvalidValue  # noqa: E402
from settings.command_line import checked_jobs, for_hydra, split_command_line, take_launch_flags  # noqa: E402


def refused(err: ConfigError) -> NoReturn:
    """End the command on a bad command line: one ``error:`` line, exit status 2."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


def check_overrides(argv: list[str]) -> None:
    """The overrides themselves, read, swept and composed (``checked_jobs``): a key or a group option
    that does not exist is the commonest mistake, and is refused here before torch and Flower load
    (some 3 s); every value is checked after them (``planned_jobs``), on the compositions cached now."""
    command = split_command_line(take_launch_flags(argv)[1])
    if not command.other_flags:
        checked_jobs(command)


if __name__ == "__main__":
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        refused(err)

from common.folders import check_output_folder  # noqa: E402
from common.text import counted  # noqa: E402
from data.scene import planned_scene, prepare_scene  # noqa: E402
from launch.jobs import Finished, Job, Launcher  # noqa: E402
from reports.runs import MULTIRUN_INDEX  # noqa: E402  (a multirun lists its jobs' out_dirs for report.py)
from server.config import RunPlan, load_run  # noqa: E402
from server.interrupt import exit_now, handle_interrupts, stopped_by, stopped_line  # noqa: E402
from settings.compose import COMMAND_KEY, CONF_DIR, RUN_CONFIG_KEY, WORKDIR_KEY  # noqa: E402  (also registers the default out_dir's resolvers)
from settings.run import check_ray_address  # noqa: E402

GROUND_TRUTH = "ground_truth"


def with_ground_truth(cfg: DictConfig, overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """A simulation has its scene's ground truth: ``ground_truth=true`` unless the overrides set it."""
    if any(override.lstrip("+~").split("=", 1)[0] == GROUND_TRUTH for override in overrides):
        return cfg, overrides
    merged = OmegaConf.merge(cfg, {GROUND_TRUTH: True})
    assert isinstance(merged, DictConfig)
    return merged, [*overrides, f"{GROUND_TRUTH}=true"]


def check_simulation(plan: RunPlan) -> None:
    """What only a simulation needs: its clients run on this machine (their device must be here) and
    Ray must accept the extra arguments."""
    from server.simulation_engine import check_ray_init_args
    from task.device import check_device

    check_device("client.device", plan.settings.client.device)
    check_ray_init_args(plan.settings.simulation.ray_init_args)
    check_ray_address("simulation.ray_address", plan.settings.simulation.ray_address)


def check_client_sizes(sizes: Sequence[int], plan: RunPlan) -> None:
    """Every client of the scene must hold what the strategy needs of it."""
    need = plan.strategy.cls.min_client_samples
    if min(sizes) < need:
        raise ConfigError(f"num_clients={plan.settings.num_clients} is invalid: strategy {plan.strategy.name} needs "
                          f"at least {need} samples per client, and this scene's smallest client holds "
                          f"{min(sizes)}; use fewer clients or another partition")


def preflight(argv: list[str]) -> list[RunPlan]:
    """Every check of ``sim.py argv`` before any work (no scene, no file or folder, no Ray): the
    overrides read, swept (``-m``) and composed, each job's every value, and its data against the
    scene it asks for. Returns each job's plan.
    A command line with Hydra's own flags (``--cfg``, ``--help``) is left to Hydra."""
    return [plan for _, plan in planned_jobs(argv)]


def planned_jobs(argv: list[str]) -> list[tuple[list[str], RunPlan]]:
    """``preflight``'s checks; returns each job's overrides and plan."""
    command = split_command_line(argv)
    if command.other_flags:
        return []
    if command.multirun:
        # Hydra writes multirun.yaml there before the first job: it must be a folder we can write.
        given = [word.partition("=")[2] for word in command.overrides if word.startswith("hydra.sweep.dir=")]
        check_output_folder("hydra.sweep.dir", given[-1] if given else "multirun")
    plans = []
    for words, cfg in checked_jobs(command):
        cfg, _ = with_ground_truth(cfg, words)
        plan = load_run(cfg)
        check_simulation(plan)
        # The data and the scene itself (built in memory, or the file the run would reuse): what the
        # strategy needs of every client.
        scene, _, _ = planned_scene(plan.settings.scene, plan.settings.out_dir)
        check_client_sizes([int(size) for size in scene.client_sizes()], plan)
        plans.append((words, plan))
    return plans


def run(cfg: DictConfig, overrides: list[str]) -> dict:
    """Check, build the scene, run the simulation; returns the results payload."""
    from client.app import app as client_app
    from server.app import app as server_app
    from server.cluster import check_nodes
    from server.results import read_results
    from server.simulation_engine import run_simulation_engine

    cfg, overrides = with_ground_truth(cfg, overrides)
    settings = load_run(cfg).settings
    prepare_scene(settings.scene, settings.out_dir)
    if not settings.simulation.verbose:
        # Our progress line per round replaces Flower's multi-line round logs.
        logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation_engine(
        server_app,
        client_app,
        num_supernodes=settings.num_clients,
        # The working folder: on a Ray cluster a client's process starts elsewhere, and a relative
        # out_dir must name the same folder there.
        run_config={RUN_CONFIG_KEY: shlex.join(overrides), WORKDIR_KEY: os.getcwd(), COMMAND_KEY: shlex.join(sys.argv)},
        simulation=settings.simulation,
        check_nodes=lambda address: check_nodes(address, settings),
    )
    return read_results(settings.out_dir)


def runtime_failed(err: RuntimeError) -> NoReturn:
    """End the process on a failure of the simulation runtime: one ``error:`` line with its root
    cause, exit status 1. A hard exit: the ServerApp thread the runtime leaves behind would otherwise
    keep the process waiting for nodes until its own timeout."""
    cause: BaseException = err
    while cause.__cause__ is not None:
        cause = cause.__cause__
    reason = (str(cause).splitlines() or [type(cause).__name__])[0]
    print(f"error: the simulation runtime failed: {type(cause).__name__}: {reason}", file=sys.stderr)
    exit_now(1)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """The ``sim.py`` command: run the composed config and print the summary; a bad config prints one
    ``error:`` line and exits with status 2."""
    hydra_cfg = HydraConfig.get()
    handle_interrupts()
    if hydra_cfg.mode == RunMode.MULTIRUN and MULTIRUN.jobs:
        # Each job of a serial multirun names itself as it starts, as --jobs names its jobs (by its own
        # overrides, so the name holds whatever order the sweeper takes the jobs in).
        swept = " ".join(word for word in hydra_cfg.overrides.task if _key(word) in MULTIRUN.swept)
        print(f"[job {hydra_cfg.job.num + 1}/{MULTIRUN.jobs}] {swept}", flush=True)
    try:
        run(cfg, list(hydra_cfg.overrides.task))
    except ConfigError as err:
        refused(err)
    except RuntimeError as err:
        runtime_failed(err)
    except (KeyboardInterrupt, SystemExit) as stop:
        # Flower's runtime and run_simulation_engine have stopped the workers and Ray on the way here.
        how = stopped_by(stop)
        if how is None:
            raise
        print(f"\n{stopped_line(cfg.out_dir, how[0])}", file=sys.stderr)
        exit_now(how[1])
    if hydra_cfg.mode == RunMode.MULTIRUN:
        with open(Path(hydra_cfg.sweep.dir) / MULTIRUN_INDEX, "a") as index:
            index.write(f"{Path(cfg.out_dir).resolve()}\n")


def launcher_for(argv: list[str]) -> tuple[Launcher, list[str]]:
    """The launcher that sim.py's own flags in ``argv`` ask for (``take_launch_flags``), and the other
    words of ``argv`` (for Hydra)."""
    given, rest = take_launch_flags(argv)

    def integer(flag: str) -> int | None:
        if flag not in given:
            return None
        if not given[flag].isdigit():
            raise InvalidValue(flag, given[flag], "allowed is an integer >= 1")
        return int(given[flag])

    jobs = integer("--jobs")
    launcher = Launcher(jobs=1 if jobs is None else jobs, cluster=given.get("--cluster"),
                        job_cpus=integer("--job-cpus"))
    if given and not split_command_line(rest).multirun:
        flag = next(iter(given))
        raise ConfigError(f"{flag} is invalid here: it runs the jobs of a multirun; add -m")
    return launcher, rest


def sweep_folder(overrides: list[str]) -> Path:
    """The multirun's folder, as Hydra would name it (``hydra.sweep.dir``, or the conf's default)."""
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    given = [word.partition("=")[2] for word in overrides if word.startswith("hydra.sweep.dir=")]
    if given:
        return Path(given[-1])
    setup_globals()  # Hydra's resolvers (``now``) that the default folder's name uses
    return Path(str(OmegaConf.load(CONF_DIR / "config.yaml").hydra.sweep.dir))


def _key(word: str) -> str:
    return word.partition("=")[0]


def swept_keys(words: list[list[str]]) -> set[str]:
    """The keys whose values differ between the jobs ``words`` (each job's overrides): they name a job."""
    shared = set.intersection(*(set(job) for job in words)) if words else set()
    return {_key(word) for job in words for word in job if word not in shared}


def job_names(words: list[list[str]]) -> list[str]:
    """Each job's name: its number and the overrides that differ between the jobs (the swept ones)."""
    swept = swept_keys(words)
    return [f"{k + 1}/{len(words)} " + " ".join(word for word in job if _key(word) in swept)
            for k, job in enumerate(words)]


@dataclass
class Multirun:
    """The command's multirun as its jobs see it: how many there are and the keys that name them
    (set before Hydra runs them; the jobs of a serial multirun run in this process)."""

    jobs: int = 0
    swept: set[str] = field(default_factory=set)


MULTIRUN = Multirun()


def run_concurrently(jobs: list[tuple[list[str], RunPlan]], argv: list[str], launcher: Launcher) -> int:
    """Run a multirun's checked ``jobs`` (``planned_jobs(argv)``) with ``launcher``, each a ``sim.py``
    process of its own, as a serial multirun would run it; list each finished run in the sweep folder
    for report.py. Returns the exit status: 0 when every job succeeded, else 1 after one line per
    failed job."""
    words = [job_words for job_words, _ in jobs]
    names = job_names(words)
    out_dirs = {name: str(Path(plan.settings.out_dir).resolve()) for name, (_, plan) in zip(names, jobs)}
    for folder in set(out_dirs.values()):
        sharing = list(out_dirs.values()).count(folder)
        if sharing > 1:
            raise InvalidValue("--jobs", launcher.jobs, f"jobs that write to different folders; {sharing} jobs "
                                                        f"would write to {folder} at once (set out_dir per job)")
    sweep = sweep_folder(split_command_line(argv).overrides)
    sweep.mkdir(parents=True, exist_ok=True)

    def listed(finished: Finished) -> None:
        if finished.ok:
            with open(sweep / MULTIRUN_INDEX, "a") as index:
                index.write(f"{out_dirs[finished.job.name]}\n")

    try:
        ended = launcher.run([Job(name, launcher.sim_argv(job)) for name, job in zip(names, words)], listed)
    except (KeyboardInterrupt, SystemExit) as stop:
        how = stopped_by(stop)
        if how is None:
            raise
        print(f"\nstopped by {how[0]}: the jobs still running were stopped; the finished ones are listed in "
              f"{sweep / MULTIRUN_INDEX}. The same command with resume=true continues each stopped run from "
              "its last checkpoint", file=sys.stderr)
        return how[1]
    where = f" on {launcher.cluster}" if launcher.cluster else ""
    print(f"\n{counted(len(ended), 'job')}, {launcher.jobs} at a time{where}; runs listed in {sweep / MULTIRUN_INDEX}")
    for finished in ended:
        state = "ok" if finished.ok else f"FAILED (exit status {finished.returncode})"
        print(f"  {finished.seconds:8.1f} s  {state:<8}  {finished.job.name}  ->  {out_dirs[finished.job.name]}")
    failed = [finished for finished in ended if not finished.ok]
    for finished in failed:
        print(f"error: job {finished.job.name} exited with status {finished.returncode}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        launcher, argv = launcher_for(sys.argv[1:])
        jobs = planned_jobs(argv)
        MULTIRUN.jobs, MULTIRUN.swept = len(jobs), swept_keys([job_words for job_words, _ in jobs])
        if launcher.concurrent:
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # run_concurrently stops its jobs
            sys.exit(run_concurrently(jobs, argv, launcher))
    except ConfigError as err:
        refused(err)
    sys.argv = [sys.argv[0], *for_hydra(argv)]
    main()
