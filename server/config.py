"""Check a composed configuration once, before any work, into the typed settings of a whole run.

``sim.py`` and the ServerApp call ``load_run``; the ClientApp needs only ``settings.run``. Raises one
ConfigError naming the first bad value and what is allowed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from common.errors import InvalidValue
from common.folders import check_output_folder
from common.run_files import RESULTS, read_payload
from common.seeding import rng_for
from server.checkpoints import CheckpointStore, RunRecord
from settings.identity import EXECUTION_KEYS, config_changes, run_differences
from settings.run import RunSettings, run_settings
from settings.scene import resolved
from strategies.context import StrategyContext
from strategies.participation import Participation
from strategies.registry import StrategyPlan, plan_strategy
from task.device import check_device


@dataclass(frozen=True)
class RunPlan:
    """A checked run: its settings and its strategy's."""

    settings: RunSettings
    strategy: StrategyPlan

    def context(self, **known: Any) -> StrategyContext:
        """The strategy's context; ``known`` adds what only the running server knows (the model's
        parameter names, the scene's ground truth, the second network's initialiser)."""
        return strategy_context(self.settings, **known)


def strategy_context(settings: RunSettings, **known: Any) -> StrategyContext:
    """The strategies' view of the run's settings, with a fresh client-sampling generator."""
    return StrategyContext(num_clients=settings.num_clients, seed=settings.seed,
                           rng=rng_for(settings.seed, "client-sampling"), comm_budget=settings.comm_budget,
                           skip_failed=settings.server.on_client_error == "skip",
                           participation=Participation.drawn(settings.num_clients, settings.participation.late,
                                                             settings.participation.join_round, settings.seed),
                           iid=settings.scene.partition.name == "iid", ground_truth=settings.ground_truth, **known)


def check_server_extras(settings: RunSettings) -> None:
    """What the server needs installed for the run's settings (a client node needs none of it)."""
    for name in ("tensorboard", "mlflow"):  # each switch, its package and the extra that installs it share a name
        if getattr(settings.logging, name) and importlib.util.find_spec(name) is None:
            raise InvalidValue(f"logging.{name}", True, f'true needs the {name} package: '
                               f'.venv/bin/python -m pip install -e ".[{name}]"')
    uri = settings.logging.mlflow_uri
    if settings.logging.mlflow and uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE") != "true":
        raise InvalidValue("logging.mlflow_uri", uri, "allowed is an sqlite:/// or http(s):// store (MLflow "
                           "refuses its old file store unless MLFLOW_ALLOW_FILE_STORE=true)")


BOOKKEEPING_KEYS = frozenset({"out_dir", "comm_budget", "server.checkpoint_every", "server.keep_checkpoints"})
"""Keys a run that starts from another run's checkpoint may change besides its strategy's stage keys
(``stages12_from``), and the only ones besides how it executes that a run extending another may
change (``extend_from``): the budget only sizes what comes after that checkpoint."""


RESUME_MAY_CHANGE = EXECUTION_KEYS | {"out_dir"}
"""Keys a resume may change: how the run executes, and ``out_dir``, which may name the run's folder by
another path than its start did (relative, through a link, or after the folder moved whole): what a
run computes does not depend on where it is."""


def check_resume(settings: RunSettings) -> None:
    """``resume=true`` continues the run in out_dir only with the config it was started with (but
    ``RESUME_MAY_CHANGE``)."""
    if not settings.resume:
        return
    record = CheckpointStore(settings.out_dir).record()
    if record is None:
        return
    changes = config_changes(record.config, settings.resolved, RESUME_MAY_CHANGE)
    if changes:
        raise InvalidValue("resume", True, f"the run in {settings.out_dir} was started with another config; "
                                           f"resume it unchanged or set resume=false to start over. Differing: "
                                           f"{'; '.join(changes[:6])}{' ...' if len(changes) > 6 else ''}")


def check_folder_holds_this_run(settings: RunSettings) -> None:
    """A run starting in out_dir may replace the results of the same run there (same config outside
    ``settings.identity.NOT_IDENTITY``); another run's only with ``replace=true``, else it is refused
    before any work."""
    if settings.replace or (settings.resume and CheckpointStore(settings.out_dir).record() is not None):
        return  # told to replace, or continuing its own run (check_resume compared the configs)
    try:
        earlier = json.loads((Path(settings.out_dir) / RESULTS).read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return  # no results there (or none this version can read as a run's)
    changes = run_differences(earlier, settings.resolved) if isinstance(earlier, dict) else []
    if changes:
        raise InvalidValue("out_dir", settings.out_dir,
                           f"a folder without another run's results; it holds a run with another config "
                           f"(differing: {'; '.join(changes[:4])}{' ...' if len(changes) > 4 else ''}): choose "
                           f"another out_dir, or set replace=true to replace that run")


def resumes_own_run(settings: RunSettings) -> bool:
    """Whether the run continues from its own checkpoint (then it no longer needs the run it started from)."""
    own = CheckpointStore(settings.out_dir)
    return settings.resume and own.latest() is not None and own.record() is not None


def source_run(settings: RunSettings, key: str, folder: str, itself: str) -> tuple[CheckpointStore, RunRecord]:
    """The checkpoints and record of the run in ``folder`` that this run starts from (``key`` names it):
    another run's folder, with a run record this version wrote, of a run that ``itself`` (rather than
    taking them from a third run)."""
    source = Path(folder).expanduser()
    if source.resolve() == Path(settings.out_dir).resolve():
        raise InvalidValue(key, folder, "another run's folder: this run writes to it (set out_dir elsewhere)")
    store = CheckpointStore(source)
    record = store.record()
    if record is None:
        raise InvalidValue(key, folder, "the folder of a run this version wrote (it has no checkpoints/run.json)")
    if record.lineage.parent:
        raise InvalidValue(key, folder, f"a run that {itself} itself (that one took them from another run)")
    return store, record


def check_start(settings: RunSettings, strategy: StrategyPlan) -> None:
    """A run that starts from another run's checkpoint (``strategy.stages12_from``): that run must
    exist, have that checkpoint, have computed it itself, and differ from this run only where the
    strategy allows."""
    start = strategy.settings.starts_from(settings.num_clients)
    if start is None or resumes_own_run(settings):
        return
    folder, checkpoint_round = start
    key = "strategy.stages12_from"
    store, record = source_run(settings, key, folder, "did its stages 1-2")
    if store.at(checkpoint_round) is None:
        raise InvalidValue(key, folder, f"a run with a checkpoint at the end of its stage 2 (round "
                                        f"{checkpoint_round}); it has checkpoints at rounds {list(store.rounds())}")
    ignore = EXECUTION_KEYS | BOOKKEEPING_KEYS | {f"strategy.{name}" for name in strategy.settings.differing_keys()}
    changes = config_changes(record.config, settings.resolved, frozenset(ignore))
    if changes:
        raise InvalidValue(key, folder, f"a run whose stages 1-2 match this run's; differing: "
                                        f"{'; '.join(changes[:6])}{' ...' if len(changes) > 6 else ''}")


def check_extension(settings: RunSettings, strategy: StrategyPlan) -> None:
    """A run that extends another (``extend_from``): that run must be finished, have computed its
    rounds itself, differ from this run only in a smaller ``comm_budget``, and run a strategy whose
    earlier rounds do not depend on the budget."""
    if settings.extend_from is None or resumes_own_run(settings):
        return
    key, folder = "extend_from", settings.extend_from
    if not strategy.cls.extends(strategy.settings):
        raise InvalidValue(key, folder, f"null with strategy={strategy.name}: its comm_budget shapes its earlier "
                                        "rounds too, so it runs from round 0")
    if strategy.settings.starts_from(settings.num_clients) is not None:
        raise InvalidValue(key, folder, "null with strategy.stages12_from: a run starts from one other run")
    store, record = source_run(settings, key, folder, "computed its rounds")
    try:
        payload = read_payload(store.dir.parent)
    except (OSError, ValueError):
        payload = {}
    last = payload["rounds"][-1]["round"] if payload.get("complete") and payload["rounds"] else None
    if last is None or store.at(last) is None:
        raise InvalidValue(key, folder, "a finished run with the checkpoint of its last round (this one is not "
                                        "finished: resume it first)")
    earlier, budget = record.config.get("comm_budget"), settings.comm_budget
    if earlier is None or budget is None or budget <= earlier:
        raise InvalidValue(key, folder, f"a run with a comm_budget smaller than this run's ({budget}); that run's "
                                        f"is {earlier}")
    changes = config_changes(record.config, settings.resolved, EXECUTION_KEYS | BOOKKEEPING_KEYS | {key})
    if changes:
        raise InvalidValue(key, folder, f"a run of this config at a smaller comm_budget; differing: "
                                        f"{'; '.join(changes[:6])}{' ...' if len(changes) > 6 else ''}")


def load_run(cfg: DictConfig | dict[str, Any]) -> RunPlan:
    """The run's settings and its strategy's, every value checked: also that the server can write
    its out_dir, has the device it evaluates on, and can resume or start where the config says."""
    settings = run_settings(cfg)
    check_output_folder("out_dir", settings.out_dir)
    check_device("server.device", settings.server.device)
    check_server_extras(settings)
    strategy = plan_strategy(resolved(cfg)["strategy"], strategy_context(settings))
    check_resume(settings)
    check_folder_holds_this_run(settings)
    check_start(settings, strategy)
    check_extension(settings, strategy)
    return RunPlan(settings, strategy)
