"""How runs are launched at the same time (launch.jobs, sim.py's --jobs/--cluster/--job-cpus) and how a
cluster address is declared (simulation.ray_address), without starting a process or Ray: the flags
and their refusals, each job's command, which steps of a plan may start as others end, and what a
simulated client on another node reads."""

from __future__ import annotations

import io
import signal
import sys
import threading
from pathlib import Path

import pytest

import sim
from common.errors import ConfigError
from launch.jobs import STOPPED_LINE, Finished, Job, Launcher, Schedule, Step, _echo
from server.interrupt import stopped_line
from settings.compose import compose_config
from settings.run import RayAddress, anchored, run_settings

SMOKE = ["experiment=smoke", "strategy=fedavg"]


def test_launch_flags_are_taken_out_of_the_command_line_in_both_forms():
    launcher, rest = sim.launcher_for(["-m", "seed=1,2", "--jobs", "2", "--job-cpus=1", "strategy=fedavg"])
    assert launcher == Launcher(jobs=2, cluster=None, job_cpus=1)
    assert rest == ["-m", "seed=1,2", "strategy=fedavg"]
    assert launcher.concurrent and launcher.cpus() == 1


def test_a_command_without_launch_flags_runs_as_before():
    launcher, rest = sim.launcher_for(["seed=2"])
    assert not launcher.concurrent and rest == ["seed=2"]


@pytest.mark.parametrize(("argv", "message"), [
    (["-m", "seed=1,2", "--jobs", "0"], "error: --jobs=0 is invalid: allowed is an integer >= 1"),
    (["-m", "seed=1,2", "--jobs=two"], "error: --jobs='two' is invalid: allowed is an integer >= 1"),
    (["-m", "seed=1,2", "--jobs"], "error: --jobs is invalid: it needs a value"),
    (["-m", "seed=1,2", "--job-cpus=0"], "error: --job-cpus=0 is invalid: allowed is an integer >= 1"),
    (["seed=1", "--jobs", "2"], "error: --jobs is invalid here: it runs the jobs of a multirun; add -m"),
    (["-m", "seed=1,2", "--cluster", "nowhere"], "error: --cluster='nowhere' is invalid: allowed are"),
    (["-m", "seed=1,2", "--cluster", "127.0.0.1:1"], "error: --cluster='127.0.0.1:1' is invalid: a Ray cluster "
                                                    "that answers"),
])
def test_bad_launch_flags_are_refused_in_one_line(argv, message):
    with pytest.raises(ConfigError) as refused:
        sim.launcher_for(argv)
    assert f"error: {refused.value}".startswith(message)
    assert "\n" not in str(refused.value)


def test_each_job_runs_sim_py_with_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    argv = Launcher(jobs=3).sim_argv(["seed=2"])
    assert argv[0] == sys.executable and Path(argv[1]).name == "sim.py"
    assert argv[2:] == ("seed=2", "++simulation.ray_init_args.num_cpus=2")
    # A job never takes fewer CPUs than one, and the user's own Ray size wins.
    assert Launcher(jobs=16).cpus() == 1
    assert Launcher(jobs=2).sim_argv(["+simulation.ray_init_args.num_cpus=3"])[2:] == (
        "+simulation.ray_init_args.num_cpus=3",)


def test_a_job_on_a_cluster_starts_a_ray_of_its_own_on_its_node(monkeypatch):
    monkeypatch.setattr("launch.jobs.check_ray_address", lambda key, address: None)
    launcher = Launcher(jobs=4, cluster="auto")
    argv = launcher.sim_argv(["seed=1", "simulation.ray_address=10.0.0.1:6379"])
    # The run does not join the cluster it runs on: Flower would size its actor pool by the whole cluster.
    assert argv[-2:] == ("++simulation.ray_init_args.num_cpus=1", "simulation.ray_address=null")


def test_jobs_are_named_by_what_their_sweep_changes():
    names = sim.job_names([["experiment=smoke", "seed=1", "strategy=fedavg"],
                           ["experiment=smoke", "seed=2", "strategy=fedavg"]])
    assert names == ["1/2 seed=1", "2/2 seed=2"]


def test_concurrent_jobs_that_would_share_a_folder_are_refused_before_any_work(tmp_path):
    argv = ["-m", *SMOKE, "strategy.train.lr=0.05,0.1", f"out_dir={tmp_path / 'same'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    with pytest.raises(ConfigError, match=r"--jobs=2 is invalid: jobs that write to different folders; 2 jobs"):
        sim.run_concurrently(sim.planned_jobs(argv), argv, Launcher(jobs=2))
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "same").exists()


def test_the_sweep_folder_is_hydras():
    assert sim.sweep_folder(["hydra.sweep.dir=somewhere", "seed=1"]) == Path("somewhere")
    default = sim.sweep_folder(["seed=1"])
    assert default.parent == Path("multirun") and len(default.name) == len("2026-01-01_00-00-00")


@pytest.mark.parametrize("address", [None, "auto", "10.0.0.1:6379", "ray://head:10001"])
def test_a_ray_address_is_null_auto_or_host_and_port(address):
    RayAddress().check("simulation.ray_address", address)


@pytest.mark.parametrize("address", RayAddress().invalid())
def test_other_ray_addresses_are_refused(address):
    with pytest.raises(ConfigError, match="allowed are null"):
        RayAddress().check("simulation.ray_address", address)


def test_the_cluster_address_has_its_own_key():
    with pytest.raises(ConfigError, match=r"ray_init_args.address='auto' is invalid: set simulation.ray_address"):
        run_settings(compose_config([*SMOKE, "+simulation.ray_init_args.address=auto"]))


def test_a_client_on_another_node_reads_relative_paths_from_the_drivers_folder():
    settings = run_settings(compose_config([*SMOKE, "out_dir=runs/a", "dataset.root=data/digits",
                                            "dataset.cache_dir=/cache"]))
    moved = anchored(settings, "/work/run")
    assert moved.out_dir == "/work/run/runs/a"
    assert moved.scene.dataset.root == "/work/run/data/digits"
    assert moved.scene.dataset.cache_dir == "/cache", "an absolute path stays"
    assert anchored(moved, "/elsewhere") == moved


def test_client_resources_that_no_cluster_node_holds_are_refused():
    from server.cluster import check_fit

    settings = run_settings(compose_config([*SMOKE, "simulation.num_cpus_per_client=4",
                                            "simulation.ray_address=10.0.0.1:6379"]))
    two_small = [{"Resources": {"CPU": 2.0}}, {"Resources": {"CPU": 3.0}}]
    # Five CPUs in all, but four on no single node: Flower counts actors per node.
    with pytest.raises(ConfigError, match=r"num_cpus_per_client=4 is invalid: resources one node of the cluster "
                                          r"holds \(its largest node has 3 CPUs"):
        check_fit(two_small, settings)
    check_fit([*two_small, {"Resources": {"CPU": 4.0}}], settings)


def test_the_swept_keys_are_those_whose_values_differ_between_the_jobs():
    """What names each job of a serial multirun as it starts, whatever the order Hydra runs them in."""
    words = [["experiment=smoke", "seed=1", "strategy=fedavg", "noise.rho=0.4"],
             ["experiment=smoke", "seed=2", "strategy=fedavg", "noise.rho=0.4"],
             ["experiment=smoke", "seed=1", "strategy=fedprox", "noise.rho=0.4"]]
    assert sim.swept_keys(words) == {"seed", "strategy"}
    assert sim.swept_keys([["seed=1"]]) == set() and sim.swept_keys([]) == set()


def _schedule_of(after: list[tuple[int, ...]], nothing: frozenset[int] = frozenset()):
    """A schedule of steps whose jobs are named by their position; the steps of ``nothing`` have nothing to run.
    Returns it and the positions whose ``make`` was called, in order."""
    made: list[int] = []

    def make(k: int) -> Job | None:
        made.append(k)
        return None if k in nothing else Job(str(k), ("true",))

    steps = [Step(lambda k=k: make(k), needs) for k, needs in enumerate(after)]
    return Schedule(steps), made


def test_a_step_starts_once_the_steps_it_comes_after_ended_the_earliest_ready_first():
    schedule, made = _schedule_of([(), (), (0,), ()])
    assert [k for k, _ in schedule.ready(2)] == [0, 1]
    assert schedule.ready(0) == []
    schedule.end(1, Finished(Job("1", ("true",)), 0, 1.0))
    assert [k for k, _ in schedule.ready(1)] == [3], "step 2 waits for step 0; step 3 needs nothing"
    schedule.end(0, Finished(Job("0", ("true",)), 0, 1.0))
    assert [(k, job.name) for k, job in schedule.ready(2)] == [(2, "2")]
    assert made == [0, 1, 3, 2], "a step's job is made only when it may start"


def test_a_step_after_a_failed_or_skipped_one_is_skipped_and_one_with_nothing_to_run_lets_the_next_start():
    schedule, made = _schedule_of([(), (0,), (1,), (), (3,)], nothing=frozenset({3}))
    assert [k for k, _ in schedule.ready(5)] == [0, 4], "step 3 had nothing to run, so step 4 may start"
    schedule.end(0, Finished(Job("0", ("false",)), 1, 1.0))
    schedule.end(4, Finished(Job("4", ("true",)), 0, 1.0))
    assert schedule.ready(5) == []
    assert made == [0, 3, 4]
    ended = schedule.results()
    assert [None if outcome is None else outcome.returncode for outcome in ended] == [1, None, None, None, 0]
    assert schedule.skipped == {1, 2}


def test_a_step_may_come_only_after_earlier_steps_and_results_wait_for_every_step():
    with pytest.raises(ValueError, match="each must be an earlier step"):
        Schedule([Step(lambda: None, (1,)), Step(lambda: None)])
    schedule, _ = _schedule_of([(), ()])
    schedule.ready(1)
    with pytest.raises(RuntimeError, match="did not end"):
        schedule.results()


def test_a_sigterm_while_jobs_run_unwinds_the_launcher_which_then_gives_its_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    made: list[int] = []

    def make(k: int) -> Job | None:
        made.append(k)
        signal.raise_signal(signal.SIGTERM)  # ``kill`` or a scheduler's stop, while the launcher plans
        return None

    with pytest.raises(SystemExit) as stop:
        Launcher(jobs=2).run_steps([Step(lambda: make(0)), Step(lambda: make(1))])
    assert stop.value.code == signal.SIGTERM and made == [0], "nothing is started after the SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_sigterm_that_whoever_started_the_launcher_ignores_stays_ignored():
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        def make() -> None:
            signal.raise_signal(signal.SIGTERM)

        assert Launcher(jobs=2).run_steps([Step(make), Step(make, (0,))]) == [None, None]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stopped_jobs_own_line_is_echoed_but_nothing_else_it_prints_once_the_jobs_are_being_stopped(tmp_path):
    stopping = threading.Event()
    own = stopped_line(tmp_path, "SIGTERM")
    assert own.startswith(STOPPED_LINE), "the launcher knows a stopped run's line by how it begins"

    def lines():
        yield "[round 3/60] fedavg test_acc 0.61\n"
        stopping.set()
        yield "Traceback (most recent call last):\n"
        yield "ERROR : ActorDiedError\n"
        yield "\n"
        yield own + "\n"

    out = io.StringIO()
    _echo("seed=2", lines(), out, threading.Lock(), stopping)
    assert out.getvalue() == f"[seed=2] [round 3/60] fedavg test_acc 0.61\n[seed=2] {own}\n"
