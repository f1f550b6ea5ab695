"""Many runs at once: as processes on this machine, or as tasks on a Ray cluster.

A job is one command that writes only to its own folder (``python sim.py <overrides>``), so jobs need
nothing from each other while they run and their results are those of the same commands run one
after another (a run's every random choice flows from its seed, not from where or when it runs).
A job that needs another's results (a run continuing a shorter one) is a ``Step`` that comes after
it: it starts as soon as that one has ended, while the jobs that need nothing keep the pool busy.

``Launcher(jobs=N)`` runs at most N jobs at once as child processes, each with its own share of this
machine's cores. ``Launcher(jobs=N, cluster=ADDRESS)`` submits each job as a Ray task that reserves
``job_cpus`` CPUs on some node of the cluster at ADDRESS; the task runs the command on that node,
where the run starts a Ray of its own sized to the reservation. A run never spreads its clients over
the cluster's nodes here: Flower sizes a run's actor pool by the cluster's total resources, so two runs
joining one cluster would each wait for actors the other holds. Every node must see the project, the
data and the outputs at the same paths (docs/cluster.md).

Each line a job prints is echoed with the job's name in front. The first Ctrl-C, or a SIGTERM to this
process (``kill``, a scheduler's time limit), stops every job: a SIGTERM to each job's command, which
stops its run as a Ctrl-C would (a job that a script started in the background ignores SIGINT, never
SIGTERM), then SIGKILL to whatever is left of its process group after ``STOP_GRACE_S``. Of what a
stopped job prints, only its run's own line (after which round it stopped) comes through; then the job
is named with how it ended. A run stopped mid-way resumes from its checkpoint later.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from common.errors import InvalidValue
from settings.run import RayAddress, check_ray_address

# How long a stopped job may take to shut its own Ray down before it is killed.
STOP_GRACE_S = 20.0
# The key a job's own Ray takes its CPUs from (``sim.py`` passes it to ray.init).
RAY_CPUS_KEY = "simulation.ray_init_args.num_cpus"
RAY_ADDRESS_KEY = "simulation.ray_address"
# How the one line a stopped run prints begins (``server.interrupt.stopped_line``).
STOPPED_LINE = "stopped by "


@dataclass(frozen=True)
class Job:
    """One command to run; ``name`` goes in front of each line it prints."""

    name: str
    argv: tuple[str, ...]
    cwd: str = field(default_factory=os.getcwd)  # absolute: a cluster node runs it from the same path


@dataclass(frozen=True)
class Finished:
    """How a job ended: its exit status and its wall time (launch to exit)."""

    job: Job
    returncode: int
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether the command exited with status 0."""
        return self.returncode == 0


@dataclass(frozen=True)
class Step:
    """A job that may have to wait for others.

    make: gives the job when it may start (every step of ``after`` has ended), or None when nothing is
        left to run by then (say, its results turned up); called in the launcher's own thread.
    after: the positions, in the same list, of the steps whose jobs must end with status 0 first; each
        comes before this step. A step after one that failed or was skipped is skipped.
    """

    make: Callable[[], Job | None]
    after: tuple[int, ...] = ()


class Schedule:
    """Which steps of a list may start as the earlier ones end; ``outcomes`` says how each ended."""

    def __init__(self, steps: Sequence[Step]) -> None:
        for k, step in enumerate(steps):
            if any(not 0 <= j < k for j in step.after):
                raise ValueError(f"step {k} comes after {step.after}: each must be an earlier step")
        self.steps = steps
        self.waiting = list(range(len(steps)))
        self.outcomes: dict[int, Finished | None] = {}  # None: nothing to run, or skipped
        self.skipped: set[int] = set()

    def ready(self, free: int) -> list[tuple[int, Job]]:
        """Up to ``free`` jobs that may start now, the earliest steps first, each with its position."""
        started: list[tuple[int, Job]] = []
        for k in list(self.waiting):
            if len(started) >= free:
                break
            after = self.steps[k].after
            if any(self.failed(j) for j in after):
                self.waiting.remove(k)
                self.skipped.add(k)
                self.outcomes[k] = None
            elif all(j in self.outcomes for j in after):
                self.waiting.remove(k)
                job = self.steps[k].make()
                if job is None:
                    self.outcomes[k] = None
                else:
                    started.append((k, job))
        return started

    def failed(self, k: int) -> bool:
        """Whether step ``k`` was skipped or its job ended with a status other than 0."""
        outcome = self.outcomes.get(k)
        return k in self.skipped or (outcome is not None and not outcome.ok)

    def end(self, k: int, finished: Finished) -> None:
        """Note that step ``k``'s job ended."""
        self.outcomes[k] = finished

    def results(self) -> list[Finished | None]:
        """How each step ended, in the list's order (None: not run)."""
        if self.waiting or len(self.outcomes) < len(self.steps):
            raise RuntimeError("the schedule has steps that did not end")
        return [self.outcomes[k] for k in range(len(self.steps))]


@dataclass(frozen=True)
class Launcher:
    """Where and how many jobs run at once.

    jobs: at most this many at once (1: one after another).
    cluster: None, or the address of a Ray cluster (``auto``, ``host:port``) whose nodes run the jobs.
    job_cpus: CPUs each job reserves and its own Ray gets; None: this machine's cores shared by
        ``jobs`` (at least 1), or 1 on a cluster.
    """

    jobs: int = 1
    cluster: str | None = None
    job_cpus: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1:
            raise InvalidValue("--jobs", self.jobs, "allowed is an integer >= 1")
        if self.job_cpus is not None and (not isinstance(self.job_cpus, int) or self.job_cpus < 1):
            raise InvalidValue("--job-cpus", self.job_cpus, "allowed is an integer >= 1")
        if self.cluster is not None:
            RayAddress(or_none=False).check("--cluster", self.cluster)
            check_ray_address("--cluster", self.cluster)

    @property
    def concurrent(self) -> bool:
        """Whether jobs run as separate processes (several at once, or on a cluster)."""
        return self.jobs > 1 or self.cluster is not None

    def cpus(self) -> int:
        """The CPUs of each job's own Ray."""
        if self.job_cpus is not None:
            return self.job_cpus
        if self.cluster is not None:
            return 1
        return max(1, (os.cpu_count() or 1) // self.jobs)

    def sim_argv(self, overrides: Sequence[str]) -> tuple[str, ...]:
        """The ``sim.py`` command of a run with these overrides, its Ray sized to ``cpus()`` unless the
        overrides size it, and on a cluster never joining the cluster itself."""
        keys = {word.lstrip("+~").split("=", 1)[0] for word in overrides}
        extra = [] if RAY_CPUS_KEY in keys else [f"++{RAY_CPUS_KEY}={self.cpus()}"]
        if self.cluster is not None:
            extra.append(f"{RAY_ADDRESS_KEY}=null")
        return (sys.executable, str(Path(__file__).resolve().parents[1] / "sim.py"), *overrides, *extra)

    def run(self, jobs: Sequence[Job], done: Callable[[Finished], None] | None = None,
            stream: TextIO | None = None) -> list[Finished]:
        """Run ``jobs`` (at most ``self.jobs`` at once) and return how each ended, in ``jobs``' order;
        ``done`` is called as each one ends. Lines go to ``stream`` (stdout), each with its job's name."""
        ended = self.run_steps([Step(functools.partial(_given, job)) for job in jobs], done, stream)
        return [finished for finished in ended if finished is not None]

    def run_steps(self, steps: Sequence[Step], done: Callable[[Finished], None] | None = None,
                  stream: TextIO | None = None) -> list[Finished | None]:
        """``run`` for steps: each job starts once the steps it comes after have ended, the earliest
        ready step first whenever a place is free; None for a step with nothing to run or skipped."""
        schedule = Schedule(steps)
        out = stream if stream is not None else sys.stdout
        with _sigterm_unwinds():
            if self.cluster is not None:
                _ClusterRun(self, out).run(schedule, done)
            else:
                _LocalRun(self, out).run(schedule, done)
        return schedule.results()


def _unwind(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(signum)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While jobs run, a SIGTERM to this process raises ``SystemExit(SIGTERM)`` (as ``ray.init`` makes it
    do), so the launcher stops its jobs on the way out: each runs in a session of its own, which the
    signal's default, ending this process at once, would leave running. Main thread only; a SIGTERM
    that whoever started this process ignores stays ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    before = signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _given(job: Job) -> Job:
    """The job itself: the ``make`` of a step whose job is known from the start."""
    return job


def _echo(name: str, lines: Any, stream: TextIO, lock: threading.Lock,
          quiet: threading.Event | None = None) -> None:
    """Print every line of ``lines`` with ``[name]`` in front (one lock: lines of two jobs never mix).
    Once ``quiet`` is set (the jobs are being stopped: their tracebacks say nothing new), print only a
    stopped run's own line, which says after which round it stopped and how it continues."""
    for line in lines:
        if quiet is not None and quiet.is_set() and not line.startswith(STOPPED_LINE):
            continue
        with lock:
            stream.write(f"[{name}] {line.rstrip()}\n")
            stream.flush()


class _LocalRun:
    """Jobs as child processes of this one, each in its own process group."""

    def __init__(self, launcher: Launcher, stream: TextIO) -> None:
        self.launcher = launcher
        self.stream = stream
        self.lock = threading.Lock()
        self.running: dict[int, tuple[Job, subprocess.Popen[str]]] = {}
        self.stopping = threading.Event()

    def one(self, job: Job) -> Finished:
        """Run one job to its end."""
        start = time.perf_counter()
        with self.lock:
            self.stream.write(f"[{job.name}] starting: {' '.join(job.argv[1:])}\n")
            self.stream.flush()
        process = _start(job)
        self.running[process.pid] = (job, process)
        try:
            assert process.stdout is not None
            _echo(job.name, process.stdout, self.stream, self.lock, self.stopping)
            returncode = process.wait()
        finally:
            self.running.pop(process.pid, None)
        return Finished(job, returncode, time.perf_counter() - start)

    def stop(self) -> None:
        """Stop every running job (``_stop_all``), echo none of their lines from now on (a stopped run's
        traceback says nothing new) and say how each one ended."""
        self.stopping.set()
        running = list(self.running.values())
        statuses = _stop_all([process for _, process in running])
        with self.lock:
            for (job, _), status in zip(running, statuses):
                how = (f"exit status {status}" if status is not None
                       else f"killed, still running {STOP_GRACE_S:.0f} s after SIGTERM")
                self.stream.write(f"[{job.name}] stopped: {how}\n")
            self.stream.flush()

    def run(self, schedule: Schedule, done: Callable[[Finished], None] | None) -> None:
        """Run the schedule's jobs in a pool of ``launcher.jobs`` threads, each waiting on one child."""
        running: dict[Future[Finished], int] = {}
        with ThreadPoolExecutor(max_workers=self.launcher.jobs) as pool:
            try:
                while True:
                    with self.lock:  # what a step prints while it is made never splits a job's line
                        ready = schedule.ready(self.launcher.jobs - len(running))
                    running.update({pool.submit(self.one, job): k for k, job in ready})
                    if not running:
                        return
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        schedule.end(running.pop(future), future.result())
                        if done is not None:
                            done(future.result())
            except BaseException:
                for future in running:
                    future.cancel()
                self.stop()
                raise


def _start(job: Job, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a job's command in a process group of its own (a terminal's Ctrl-C reaches only this
    process, which stops the group), its output and errors in one pipe."""
    return subprocess.Popen(job.argv, cwd=job.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _stop_all(processes: list[subprocess.Popen[str]]) -> list[int | None]:
    """Stop jobs as a scheduler stops a run, so each shuts its own Ray down and keeps its checkpoint:
    SIGTERM to every job's command, then, after at most ``STOP_GRACE_S`` in all, SIGKILL to whatever is
    left of each job's group. Returns each job's exit status, None where it was still running then."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    statuses: list[int | None] = []
    for process in processes:
        try:
            statuses.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            statuses.append(None)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return statuses


def _clean_environment() -> dict[str, str]:
    """The environment of this process without Ray's own variables: a job's command starts a Ray of its
    own, which must not take itself for a worker of the cluster the task runs on."""
    return {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}


def _run_on_node(job: Job) -> tuple[int, float, str]:
    """A cluster task's body: run the job's command on this node, echo its lines (Ray forwards them to
    the launcher), and return its exit status, its seconds and the node's address."""
    import ray

    start = time.perf_counter()
    process = _start(job, _clean_environment())
    assert process.stdout is not None
    try:
        _echo(job.name, process.stdout, sys.stdout, threading.Lock())
        returncode = process.wait()
    except BaseException:  # ray.cancel
        _stop_all([process])
        raise
    node = f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"
    return returncode, time.perf_counter() - start, node


class _ClusterRun:
    """Jobs as Ray tasks on a cluster, each reserving ``launcher.cpus()`` CPUs on the node it runs on."""

    def __init__(self, launcher: Launcher, stream: TextIO) -> None:
        self.launcher = launcher
        self.stream = stream

    def run(self, schedule: Schedule, done: Callable[[Finished], None] | None) -> None:
        """Submit at most ``launcher.jobs`` tasks at a time; collect each as it ends."""
        import ray

        # Every line of every job reaches this process as printed: not folded into "repeated 5x" by Ray.
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        ray.init(address=self.launcher.cluster, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=True)
        task = ray.remote(num_cpus=self.launcher.cpus(), max_retries=0)(_run_on_node)
        running: dict[Any, tuple[int, Job]] = {}
        try:
            while True:
                for k, job in schedule.ready(self.launcher.jobs - len(running)):
                    self.stream.write(f"[{job.name}] submitted to the cluster: {' '.join(job.argv[1:])}\n")
                    self.stream.flush()
                    running[task.remote(job)] = (k, job)
                if not running:
                    return
                ready, _ = ray.wait(list(running), num_returns=1)
                k, job = running.pop(ready[0])
                returncode, seconds, node = ray.get(ready[0])
                self.stream.write(f"[{job.name}] ended with status {returncode} on node {node}\n")
                ended = Finished(job, returncode, seconds)
                schedule.end(k, ended)
                if done is not None:
                    done(ended)
        finally:
            for ref in running:
                ray.cancel(ref)
            ray.shutdown()
