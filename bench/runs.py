"""What the accuracy benchmarks share: running one configured simulation (reusing its finished
results, or resuming it from its checkpoint), FedCorr runs that take over another planned run's stages
1-2, and finding where a run's test accuracy plateaus.

With ``reuse`` a run already finished with the same config is not run again, and an unfinished one
(stopped mid-run) whose ``checkpoints/run.json`` holds the same config continues from its latest
checkpoint (``resume=true``; one line ``resuming <out_dir> from round R``). ``run_plan`` runs a
benchmark's runs in order; FedCorr runs that differ only in what their stage 3 reads (``stages12_groups``)
run stages 1-2 once: the group's first run (the plain FedCorr one if planned) does them, the others take
them over from its stage-2 checkpoint (``strategy.stages12_from``), and ``print_time_saved`` says what
that saved.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import DictConfig, OmegaConf  # noqa: E402

import sim  # noqa: E402
from common.errors import ConfigError  # noqa: E402
from launch.jobs import Job, Launcher, Step  # noqa: E402
from reports.tables import mean_std  # noqa: E402
from server.checkpoints import CheckpointStore  # noqa: E402
from server.config import BOOKKEEPING_KEYS, RESUME_MAY_CHANGE, load_run  # noqa: E402
from server.interrupt import stopped_by  # noqa: E402
from server.results import read_results  # noqa: E402
from settings.compose import compose_config  # noqa: E402
from settings.identity import EXECUTION_KEYS, changed_keys, config_changes  # noqa: E402
from strategies.fedcorr import FedCorrSettings  # noqa: E402

Key = TypeVar("Key", bound=Hashable)

PLATEAU_WINDOW = 20
PLATEAU_POINTS = 0.003
STAGES12_FROM = "strategy.stages12_from"
EXTEND_FROM = "extend_from"
# Keys in which a finished run may differ from the planned one and still be its run: what a resume may
# change (how it executed, and the path it named its folder by), and how it began: a run that took its
# stages 1-2 from another run or extended a shorter one computes what the same run from round 0
# computes (check_start and check_extension make sure the two runs agree in everything else).
REUSE_IGNORES = RESUME_MAY_CHANGE | {STAGES12_FROM, EXTEND_FROM}


def finished_results(out_dir: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The results in ``out_dir`` if that run completed with ``config`` (but ``REUSE_IGNORES``: how it
    executed, where it ran, how it began); else None.

    A completed run there with a different config is an error rather than a rerun: rerunning would
    overwrite hours of finished work because, say, a default changed since. The message names the
    differing keys so the user can decide (remove the folder, or run without --reuse)."""
    path = Path(out_dir) / "results.json"
    if not path.is_file():
        return None
    payload = json.loads(path.read_text())
    if not payload.get("complete"):
        return None
    changes = changed_keys(payload.get("config") or {}, config, REUSE_IGNORES)
    if changes:
        changed = ", ".join(changes[:8])
        raise ConfigError(f"{path} holds a finished run with another config (differs in: {changed}); "
                          f"--reuse will not overwrite it: remove {out_dir} to rerun it, or run without --reuse")
    return payload


def planned(overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """The config of a planned simulation and its overrides, as ``sim.run`` will run them. A benchmark
    owns its cells' folders and reruns a cell in place (``replace=true``); ``--reuse`` is what guards
    finished work (``finished_results``)."""
    if not any(word.startswith("replace=") for word in overrides):
        overrides = ["replace=true", *overrides]
    return sim.with_ground_truth(compose_config(overrides), overrides)


def finished(overrides: list[str]) -> dict[str, Any] | None:
    """The results of this planned run if it finished with the same config; runs nothing."""
    return finished_run(planned(overrides)[0])


def finished_run(cfg: DictConfig) -> dict[str, Any] | None:
    """``finished_results`` for a composed config: its out_dir, its resolved values."""
    return finished_results(cfg.out_dir, resolved_values(cfg))


def resolved_values(cfg: DictConfig) -> dict[str, Any]:
    """A composed config's resolved values, as results.json and run.json hold them."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    return {str(key): value for key, value in values.items()}


def resume_round(out_dir: str, config: dict[str, Any]) -> int | None:
    """The round of the latest checkpoint of the unfinished run in ``out_dir`` if it was started with
    ``config`` (but the keys a resume may change, as ``resume=true`` checks); None when there is no
    such run or it wrote no checkpoint yet (it would start from round 0 anyway)."""
    store = CheckpointStore(out_dir)
    record = store.record()
    if record is None or config_changes(record.config, config, RESUME_MAY_CHANGE):
        return None
    files = store.files()
    return files[-1][0] if files else None


@dataclass
class Outcome:
    """How the benchmark got one run's results, and the time it took by the benchmark's own clock.

    how: ``reused`` (finished before), ``resumed`` (from its own checkpoint of ``resumed_from``),
    ``inherited`` (its stages 1-2 taken over from ``source``, up to round ``stage2_round``), ``extended``
    (continued from the end of the same run at a smaller budget) or ``ran``.
    seconds: wall time of this process on the run, Ray start-up included (results.json's ``wall_s`` of an
    inherited run includes its source's stages 1-2, of a resumed run the earlier attempts).
    """

    out_dir: str
    how: str
    seconds: float
    payload: dict[str, Any]
    resumed_from: int | None = None
    source: str | None = None
    stage2_round: int | None = None


@dataclass
class Ledger:
    """The outcomes of a benchmark's runs in this invocation; ``shared``: how many planned runs take
    their stages 1-2 over from another planned run (``run_plan``)."""

    outcomes: list[Outcome] = field(default_factory=list)
    shared: int = 0


@dataclass(frozen=True)
class Pending:
    """A planned run that has to run (it did not finish before): its config and overrides as ``sim.run``
    takes them, the checkpoint round it resumes from, and the run it takes stages 1-2 over from."""

    cfg: DictConfig
    overrides: list[str]
    resumed_from: int | None
    source: str | None

    @property
    def how(self) -> str:
        """``resumed``, ``inherited``, ``extended`` or ``ran`` (``Outcome.how``)."""
        if self.resumed_from is not None:
            return "resumed"
        return "inherited" if self.source else "extended" if self.cfg.get(EXTEND_FROM) else "ran"

    def record(self, payload: dict[str, Any], seconds: float, ledger: Ledger | None) -> dict[str, Any]:
        """Note the run's outcome in ``ledger``; returns ``payload``."""
        if ledger is not None:
            stage2_round = parent_round(self.cfg.out_dir) if self.source else None
            ledger.outcomes.append(Outcome(str(self.cfg.out_dir), self.how, seconds, payload, self.resumed_from,
                                           self.source, stage2_round))
        return payload


def pending(overrides: list[str], reuse: bool = False, ledger: Ledger | None = None) -> Pending | dict[str, Any]:
    """What a planned run needs: with ``reuse``, the results of the same run finished before (noted in
    ``ledger``), or a ``Pending`` that resumes it from its latest checkpoint; else a ``Pending`` from round 0."""
    cfg, overrides = planned(overrides)
    resumed_from = None
    if reuse:
        done = finished_run(cfg)
        if done is not None:
            print(f"reusing {cfg.out_dir}/results.json", flush=True)
            if ledger is not None:
                ledger.outcomes.append(Outcome(str(cfg.out_dir), "reused", 0.0, done))
            return done
        resumed_from = resume_round(cfg.out_dir, resolved_values(cfg))
        if resumed_from is not None:
            print(f"resuming {cfg.out_dir} from round {resumed_from}", flush=True)
            cfg, overrides = planned([*overrides, "resume=true"])
    source = cfg.strategy.get("stages12_from") if resumed_from is None else None
    return Pending(cfg, overrides, resumed_from, source)


def run(overrides: list[str], reuse: bool = False, ledger: Ledger | None = None) -> dict[str, Any]:
    """One simulation with these Hydra overrides, in this process. ``reuse``: return a finished run with
    the same resolved config instead of running it again, and continue an unfinished one with the same
    config from its latest checkpoint (so a long benchmark can be stopped and resumed, even mid-run).
    ``ledger`` gets the run's ``Outcome``."""
    job = pending(overrides, reuse, ledger)
    if not isinstance(job, Pending):
        return job
    start = time.perf_counter()
    payload = sim.run(job.cfg, job.overrides)
    return job.record(payload, time.perf_counter() - start, ledger)


def parent_round(out_dir: str) -> int | None:
    """The round of the checkpoint the run in ``out_dir`` started from, if it started from another run's."""
    record = CheckpointStore(out_dir).record()
    return record.lineage.parent_round if record is not None and record.lineage.parent else None


def resolved_config(overrides: list[str]) -> dict[str, Any]:
    """The resolved config of a planned run, as its results.json will hold it."""
    return resolved_values(planned(overrides)[0])


def stages12_ignores() -> frozenset[str]:
    """What a FedCorr run may change from the run it takes stages 1-2 from (``server.config.check_start``)."""
    return EXECUTION_KEYS | BOOKKEEPING_KEYS | {f"strategy.{key}" for key in FedCorrSettings.stage3_keys}


def shares_stages12(config: dict[str, Any]) -> bool:
    """Whether a run is a FedCorr run that does its own stages 1-2 (none set ``stages12_from``)."""
    strategy = config.get("strategy") or {}
    return strategy.get("name") == "fedcorr" and strategy.get("stages12_from") is None


def stages12_groups(configs: Mapping[Key, dict[str, Any]]) -> dict[Key, Key]:
    """For every planned FedCorr run that can take its stages 1-2 over from another planned run: that
    run's key. Runs share when their resolved configs differ only in what ``check_start`` allows (stage
    3's keys, out_dir, the budget, checkpoint and execution settings); a run that changes anything
    else (stage 1's learner, T2, the seed, the scene) does its own. Each group's source is its plain
    FedCorr run (stage 3 FedAvg) if it has one, else its first run in ``configs``' order."""
    ignore = stages12_ignores()
    groups: list[list[Key]] = []
    for key, config in configs.items():
        if not shares_stages12(config):
            continue
        group = next((group for group in groups if not config_changes(configs[group[0]], config, ignore)), None)
        if group is None:
            groups.append([key])
        else:
            group.append(key)
    sources: dict[Key, Key] = {}
    for group in groups:
        plain = [key for key in group if configs[key]["strategy"].get("stage3") == "fedavg"]
        source = plain[0] if plain else group[0]
        sources.update({key: source for key in group if key != source})
    return sources


def stage2_round(overrides: list[str]) -> int:
    """The last round of a planned FedCorr run's stage 2 (where a run that takes its stages 1-2 over starts)."""
    plan = load_run(planned(overrides)[0])
    settings = plan.strategy.settings
    assert isinstance(settings, FedCorrSettings)
    return settings.stages12_rounds(plan.settings.num_clients, plan.context().participation)


def inheritable(out_dir: str, checkpoint_round: int) -> bool:
    """Whether the run in ``out_dir`` did its stages 1-2 itself and kept its checkpoint of ``checkpoint_round``."""
    store = CheckpointStore(out_dir)
    record = store.record()
    return record is not None and not record.lineage.parent and store.at(checkpoint_round) is not None


def stages12_origin(out_dir: str) -> str:
    """The folder of the run that computed the stages 1-2 of the run in ``out_dir``: that run itself,
    or, for one that continued a shorter run (``extend_from``) or took its stages 1-2 over
    (``stages12_from``), the run it started from, followed back to one that started from round 0."""
    folder, seen = out_dir, set()
    while folder not in seen:
        seen.add(folder)
        record = CheckpointStore(folder).record()
        if record is None or not record.lineage.parent:
            return folder
        began = record.config.get(EXTEND_FROM) or (record.config.get("strategy") or {}).get("stages12_from")
        if began is None:
            return folder
        folder = str(began)
    return folder


def inheriting(overrides: list[str], source_overrides: list[str], source_shorter: list[list[str]] | None = None
               ) -> list[str]:
    """A run's overrides taking stages 1-2 over from the planned run of ``source_overrides`` when that
    run (finished or not) kept its stage-2 checkpoint. A source that continued a shorter run, or took
    its stages 1-2 over, holds no such checkpoint: the run it started from does (``stages12_origin``);
    so does the shorter run of ``source_shorter`` that a source not yet started will continue
    (``continued``). Else the run's own overrides, and a line saying so."""
    began = continued(source_overrides, source_shorter or [], quiet=True)
    origin = stages12_origin(began or str(planned(source_overrides)[0].out_dir))
    checkpoint_round = stage2_round(overrides)
    if inheritable(origin, checkpoint_round):
        return [*overrides, f"{STAGES12_FROM}={origin}"]
    print(f"{planned(overrides)[0].out_dir} runs its own stages 1-2: {origin} holds no checkpoint of round "
          f"{checkpoint_round} from stages 1-2 it ran itself (a run made before checkpoints, or one that took "
          f"them over)", flush=True)
    return overrides


def early_source(overrides: list[str], source_overrides: list[str], source_shorter: list[list[str]]) -> bool:
    """Whether a run can take its stages 1-2 over before its source has run: the source continues, or
    will continue, a finished shorter run whose stages 1-2 are on disk with their stage-2 checkpoint."""
    began = continued(source_overrides, source_shorter, quiet=True)
    return began is not None and inheritable(stages12_origin(began), stage2_round(overrides))


def continued(overrides: list[str], shorter: list[list[str]], quiet: bool = False) -> str | None:
    """The folder of the run a planned run continues (``extend_from``): the one it began from if it has
    started (a stopped run resumes as it began), else the first finished run of ``shorter`` (the same
    run at smaller budgets, the longest first) that computed its rounds itself and that it can continue.
    None: it runs from round 0 (unless ``quiet``, a line says why when ``shorter`` names a run it might
    have continued)."""
    cfg, _ = planned(overrides)
    record = CheckpointStore(cfg.out_dir).record()
    if record is not None:
        began = record.config.get(EXTEND_FROM)
        if began is None and shorter and not quiet:
            print(f"{cfg.out_dir} goes on as it began, from round 0: its checkpoints/run.json names no "
                  f"{EXTEND_FROM} (remove the folder to continue a shorter run instead)", flush=True)
        return None if began is None else str(began)
    for other in shorter:
        try:
            other_cfg, _ = planned(other)
            if finished_run(other_cfg) is None:
                continue
            other_record = CheckpointStore(other_cfg.out_dir).record()
            if other_record is not None and other_record.lineage.parent:
                if not quiet:
                    print(f"{cfg.out_dir} does not continue {other_cfg.out_dir}: that run took rounds from another",
                          flush=True)
                continue
            load_run(planned([*overrides, f"{EXTEND_FROM}={other_cfg.out_dir}"])[0])
        except ConfigError as err:
            if not quiet:
                print(f"{cfg.out_dir} runs from round 0: {err}", flush=True)
            return None
        return str(other_cfg.out_dir)
    return None


def extending(overrides: list[str], shorter: list[list[str]]) -> list[str]:
    """A planned run's overrides continuing the run ``continued`` names, when there is one (else it runs
    from round 0)."""
    began = continued(overrides, shorter)
    return overrides if began is None else [*overrides, f"{EXTEND_FROM}={began}"]


def budget_free(overrides: list[str]) -> bool:
    """Whether a planned run's rounds up to a smaller budget are those of the same run at that budget:
    its strategy's earlier rounds do not depend on the budget (so it could extend that run)."""
    strategy = load_run(planned(overrides)[0]).strategy
    return strategy.cls.extends(strategy.settings)


def computed_afresh(payload: Mapping[str, Any]) -> bool:
    """Whether a finished run computed every round itself: it neither extended a shorter run nor took
    FedCorr's stages 1-2 over from another (a resume of its own is the same computation)."""
    attempts = payload.get("attempts") or {}
    return attempts.get("extended_from") is None and attempts.get("stages12_from") is None


def first_unrepeated(shorter: Mapping[str, Any], longer: Mapping[str, Any]) -> int | None:
    """The first round of ``shorter`` (a finished run's results) that ``longer`` (the same run at a larger
    budget) does not repeat in every figure but the time (``elapsed_s``); None when it repeats them all."""
    theirs = longer["rounds"]
    for at, row in enumerate(shorter["rounds"]):
        if at >= len(theirs) or {**row, "elapsed_s": None} != {**theirs[at], "elapsed_s": None}:
            return int(row["round"])
    return None


def run_plan(plan: Mapping[Key, list[str]], order: list[Key], reuse: bool = False,
             ledger: Ledger | None = None, launcher: Launcher | None = None,
             shorter: Mapping[Key, list[list[str]]] | None = None,
             extends: Mapping[Key, Key] | None = None) -> dict[Key, dict[str, Any]]:
    """Run (or reuse, or resume) the planned runs in ``order``, FedCorr runs that can share stages 1-2
    taking them over from their group's source (run first, before the first run that needs it; when the
    source continues a finished shorter run, from that run, without waiting for the source), and
    the others continuing the same run at a smaller budget where ``shorter`` names one that finished
    (``extending``). ``extends`` names, for a run, the planned run of ``shorter`` it continues: it runs
    after that one and takes no stages 1-2 over, unless that one took its own stages 1-2 over (a run
    that took rounds from another cannot be continued), when it takes them from the same source. A
    concurrent ``launcher`` (``--jobs N`` / ``--cluster``) runs them as separate processes, at most N at
    once, each as soon as the run it waits for has ended (``run_concurrently``)."""
    sources = stages12_groups({key: resolved_config(plan[key]) for key in order})
    extends = {key: shorter for key, shorter in (extends or {}).items() if shorter not in sources}
    sources = {key: source for key, source in sources.items() if key not in extends}
    if ledger is not None:
        ledger.shared += len(sources)
    shorter = shorter or {}
    # A run whose source continues a finished shorter run takes stages 1-2 from that one: it need not wait.
    waits = {key: source for key, source in sources.items()
             if not (shorter.get(source) and early_source(plan[key], plan[source], shorter[source]))}
    needs = {key: [need for need in (waits.get(key), extends.get(key)) if need is not None] for key in order}
    steps = prerequisites_first(order, needs)
    if launcher is not None and launcher.concurrent:
        done = run_concurrently(plan, steps, needs, sources, reuse, ledger, launcher, shorter)
    else:
        done = {key: run(own_overrides(plan, key, sources, reuse, shorter), reuse, ledger) for key in steps}
    return {key: done[key] for key in order}


def prerequisites_first(order: list[Key], needs: Mapping[Key, list[Key]]) -> list[Key]:
    """``order`` with every run moved after the runs it ``needs`` (which go first, in their own order)."""
    placed: dict[Key, None] = {}

    def place(key: Key) -> None:
        if key not in placed:
            for need in needs.get(key, []):
                place(need)
            placed[key] = None

    for key in order:
        place(key)
    return list(placed)


def own_overrides(plan: Mapping[Key, list[str]], key: Key, sources: Mapping[Key, Key], reuse: bool,
                  shorter: Mapping[Key, list[list[str]]]) -> list[str]:
    """A planned run's overrides, taking stages 1-2 over from its source's run (which has run) or
    extending a shorter run of ``shorter``, unless it finished before and is reused."""
    overrides, source = plan[key], sources.get(key)
    if (source is None and not shorter.get(key)) or (reuse and finished(overrides) is not None):
        return overrides
    if source is not None:
        return inheriting(overrides, plan[source], shorter.get(source))
    return extending(overrides, shorter[key])


class RunsFailed(Exception):
    """Runs of a concurrent benchmark that exited with an error (their output was echoed above), and the
    planned runs not started because they wait for one of those."""

    def __init__(self, failed: list[tuple[str, int]], skipped: list[str] | None = None) -> None:
        super().__init__(f"{len(failed)} run(s) failed")
        self.failed = failed
        self.skipped = skipped or []


def run_concurrently(plan: Mapping[Key, list[str]], steps: list[Key], needs: Mapping[Key, list[Key]],
                     sources: Mapping[Key, Key], reuse: bool, ledger: Ledger | None, launcher: Launcher,
                     shorter: Mapping[Key, list[list[str]]]) -> dict[Key, dict[str, Any]]:
    """``run_plan`` with a concurrent launcher: each run a ``sim.py`` process (as ``run`` would run it in
    this one), started as soon as a place is free and the runs it ``needs`` (the one it takes stages 1-2
    over from, the one it continues; earlier in ``steps``) have ended. How it starts is decided then
    (``own_overrides``), so a run reused or finished by then is not started. A failed run stops only the
    runs that wait for it; the others go on, and then ``RunsFailed`` names them all (rerun with
    ``--reuse``)."""
    done: dict[Key, dict[str, Any]] = {}
    jobs: dict[Key, Pending] = {}

    def make(key: Key) -> Job | None:
        job = pending(own_overrides(plan, key, sources, reuse, shorter), reuse, ledger)
        if not isinstance(job, Pending):
            done[key] = job
            return None
        jobs[key] = job
        return Job(str(job.cfg.out_dir), launcher.sim_argv(job.overrides))

    position = {key: k for k, key in enumerate(steps)}
    ended = launcher.run_steps([Step(functools.partial(make, key), tuple(position[need] for need in needs[key]))
                                for key in steps])
    failed, skipped = [], []
    for key, finished_job in zip(steps, ended):
        if finished_job is not None and finished_job.ok:
            done[key] = jobs[key].record(read_results(jobs[key].cfg.out_dir), finished_job.seconds, ledger)
        elif finished_job is not None:
            failed.append((str(jobs[key].cfg.out_dir), finished_job.returncode))
        elif key not in done:
            skipped.append(str(planned(plan[key])[0].out_dir))
    if failed:
        raise RunsFailed(failed, skipped)
    return done


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--jobs``, ``--cluster`` and ``--job-cpus`` (``launch.jobs.Launcher``)."""
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once, each a separate process (default 1: one after another, in this process)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="run each run as a task on the Ray cluster at ADDRESS (auto or host:port; "
                             "docs/cluster.md)")
    parser.add_argument("--job-cpus", type=int, default=None, metavar="K",
                        help="CPUs per run (default: this machine's cores / --jobs; 1 on a cluster)")


def add_table_arguments(parser: argparse.ArgumentParser, folder: str | None = None) -> None:
    """A table benchmark's ``--reuse`` and ``--report``, ``--outputs`` (the folder ``folder`` goes in;
    None: the bench writes under outputs/ only), the launch arguments, and the Hydra overrides last."""
    parser.add_argument("--reuse", action="store_true",
                        help="reuse finished runs with the same config, resume stopped ones from their checkpoint")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: print the table of the runs finished so far ('-' for the others)")
    if folder is not None:
        parser.add_argument("--outputs", default="outputs", help=f"the folder {folder}/ goes in")
    add_launch_arguments(parser)
    parser.add_argument("overrides", nargs="*", default=[])


def launcher_from(args: argparse.Namespace) -> Launcher:
    """The launcher the benchmark's arguments ask for (checked: one ``error:`` line for a bad value)."""
    return Launcher(jobs=args.jobs, cluster=args.cluster, job_cpus=args.job_cpus)


def stages12_seconds(payload: dict[str, Any], stage2_round: int) -> float | None:
    """How long a run's stages 1-2 took: ``elapsed_s`` of its round ``stage2_round`` (the results
    writer's clock, from its first round over every attempt; Ray start-up and the scene not counted)."""
    return next((row["elapsed_s"] for row in payload.get("rounds", []) if row["round"] == stage2_round), None)


def round_seconds(payload: dict[str, Any], server_round: int) -> float | None:
    """How long round ``server_round`` of a run took (``elapsed_s`` since the round before it)."""
    end, before = stages12_seconds(payload, server_round), stages12_seconds(payload, server_round - 1)
    return None if end is None or before is None else end - before


def run_rounds(out_dir: str) -> list[dict[str, Any]]:
    """The rounds a run in ``out_dir`` wrote to rounds.jsonl so far (a line cut short by a kill ends them)."""
    path = Path(out_dir) / "rounds.jsonl"
    rows: list[dict[str, Any]] = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


@dataclass(frozen=True)
class Saving:
    """What one run that took its stages 1-2 over saved.

    stages12: its source's stages 1-2 seconds (``stages12_seconds``).
    first_round_extra: how much longer its first round took than the source's same round: there all
        its nodes start up (load their data, their state), which the source's did during stages 1-2;
        None when the source has no such round (no stage 3).
    """

    run: Outcome
    stages12: float
    first_round_extra: float | None

    @property
    def net(self) -> float:
        """The stages 1-2 seconds less the first round's extra."""
        return self.stages12 - (self.first_round_extra or 0.0)


def time_saved(ledger: Ledger) -> list[Saving]:
    """What each run that took its stages 1-2 over from another run in this invocation saved; the
    source's rounds from the ledger, else from its folder."""
    by_dir = {Path(outcome.out_dir).resolve(): outcome.payload for outcome in ledger.outcomes}
    saved = []
    for outcome in ledger.outcomes:
        if outcome.how != "inherited" or outcome.source is None or outcome.stage2_round is None:
            continue
        source = by_dir.get(Path(outcome.source).resolve()) or {"rounds": run_rounds(outcome.source)}
        seconds = stages12_seconds(source, outcome.stage2_round)
        if seconds is None:
            continue
        first, theirs = (round_seconds(payload, outcome.stage2_round + 1) for payload in (outcome.payload, source))
        extra = None if first is None or theirs is None else max(0.0, first - theirs)
        saved.append(Saving(outcome, seconds, extra))
    return saved


def print_time_saved(ledger: Ledger) -> None:
    """What sharing FedCorr's stages 1-2 and extending shorter runs saved in this invocation, and each
    run's time by the bench's clock."""
    extended = [outcome for outcome in ledger.outcomes if outcome.how == "extended"]
    if ledger.shared:
        print_stages12_saved(ledger)
    if extended:
        print_extensions_saved(extended)
    ran = [outcome for outcome in ledger.outcomes if outcome.how != "reused"]
    if ran and (ledger.shared or extended):
        print("bench clock per run (this process, Ray start-up included; results.json's wall_s of a run that "
              "took stages 1-2 over or extended a shorter run includes that run's time):")
        for outcome in ran:
            print(f"  {outcome.seconds:8.1f} s  {outcome.how:<9}  {outcome.out_dir}")


def print_extensions_saved(extended: list[Outcome]) -> None:
    """The time of the shorter runs that the ``extended`` runs continued instead of computing again
    (each one's ``attempts.extended_from``: its source's clock up to its last round)."""
    taken = [(outcome, (outcome.payload.get("attempts") or {}).get("extended_from") or {}) for outcome in extended]
    print(f"\nextend_from: {len(extended)} run(s) continued the same run at a smaller budget; in this invocation:")
    for outcome, source in taken:
        print(f"  {outcome.out_dir} continued {source.get('run_dir')} after its round {source.get('round')}: "
              f"{source.get('elapsed_s', 0.0):.1f} s not run again")
    print(f"time saved: {sum(source.get('elapsed_s', 0.0) for _, source in taken):.1f} s of shorter runs not run "
          "again (their results writer's clock, without Ray start-up and the scene)")


def print_stages12_saved(ledger: Ledger) -> None:
    """What sharing FedCorr's stages 1-2 saved in this invocation."""
    saved = time_saved(ledger)
    print(f"\nFedCorr's stages 1-2: {ledger.shared} planned run(s) take them over from another planned run "
          f"(strategy.stages12_from); in this invocation:")
    for saving in saved:
        extra = "-" if saving.first_round_extra is None else f"+{saving.first_round_extra:.1f} s"
        print(f"  {saving.run.out_dir} took them over from {saving.run.source} (round {saving.run.stage2_round}): "
              f"{saving.stages12:.1f} s of stages 1-2; its first round {extra}")
    gross = sum(saving.stages12 for saving in saved)
    extra_total = sum(saving.first_round_extra or 0.0 for saving in saved)
    print(f"time saved: {sum(saving.net for saving in saved):.1f} s net = {gross:.1f} s of stages 1-2 not run again "
          f"by {len(saved)} run(s) - {extra_total:.1f} s their first rounds took beyond the source's\n"
          "  (stages 1-2: the source's elapsed_s at its stage-2 end round in rounds.jsonl, the results writer's "
          "clock from its first round,\n  without Ray start-up and the scene, which every run pays; first round: "
          "all of a run's nodes start up there when it skips stages 1-2)")


def main_with_clear_errors(main: Callable[[], None]) -> None:
    """Run a benchmark's ``main``; bad input is one line on stderr and exit status 2, and each run that
    failed in a concurrent benchmark one line and exit status 1."""
    try:
        main()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, SystemExit) as stop:
        how = stopped_by(stop)
        if how is None:
            raise
        print(f"\nstopped by {how[0]}: the same command with --reuse continues each unfinished run from its "
              "last checkpoint", file=sys.stderr)
        sys.exit(how[1])
    except RunsFailed as err:
        for out_dir, status in err.failed:
            print(f"error: the run of {out_dir} exited with status {status} (its lines above; --reuse resumes it)",
                  file=sys.stderr)
        for out_dir in err.skipped:
            print(f"error: the run of {out_dir} did not start: a run it waits for failed", file=sys.stderr)
        sys.exit(1)


def check_all(runs: list[list[str]], reuse: bool = False) -> None:
    """Compose and check every planned run before the first starts: a typo, or (with ``reuse``) a
    finished run whose config changed, fails in seconds, not hours."""
    for overrides in runs:
        cfg, _ = planned(overrides)
        load_run(cfg)
        if reuse:
            finished_run(cfg)


def plateau(accuracies: list[float]) -> tuple[int | None, float | None]:
    """(position, mean accuracy of the window) where test accuracy first moved less than 0.3 points
    over 20 consecutive evaluations; (None, None) if it never did."""
    for end in range(PLATEAU_WINDOW, len(accuracies) + 1):
        window = accuracies[end - PLATEAU_WINDOW:end]
        if max(window) - min(window) < PLATEAU_POINTS:
            return end, sum(window) / len(window)
    return None, None


def accuracies(payload: dict[str, Any], stage: str | None = None) -> list[float]:
    """The evaluated test accuracies of a run, optionally of one stage only."""
    return [r["test_acc"] for r in payload["rounds"]
            if r["test_acc"] is not None and (stage is None or r["stage"] == stage)]


def known_mean(values: list[float | None]) -> float | None:
    """The mean of the known values (None without any)."""
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


def spread(values: list[float | None], scale: float = 1.0, digits: int = 2) -> str:
    """Mean ± sample std of the known values, compact for fixed-width tables (see ``mean_std``)."""
    return mean_std(values, scale, digits, separator="±")


def fedcorr_figure(run_payload: dict[str, Any], pick: Callable[[dict[str, Any]], float | None]) -> float | None:
    """A figure of a run's ``fedcorr`` block (None for a run without one, or without the figure)."""
    block = run_payload.get("fedcorr")
    return pick(block) if block else None
