"""A command line's Hydra overrides, checked before any work: parsed, expanded into the jobs of a
multirun, and composed with every key known. Each mistake is one ``ConfigError`` line naming the
override and what is allowed, where Hydra would print a 13-16-line block and exit 1, or silently
add a key nobody reads (``+num_client=5``).

``sim.py``, ``scene.py`` and ``export.py`` call ``checked_jobs`` first; ``sim.py`` then hands the
command line to Hydra (``for_hydra``), which can no longer fail on it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.errors import ConfigError
from common.folders import check_output_folder
from settings.compose import compose_config
from settings.scene import out_dir

# Settings that are open mappings: a user may add keys to them with ``+key=value`` (each one is
# checked where the mapping is used, e.g. ray.init's arguments).
OPEN_MAPPINGS = ("simulation.ray_init_args", "dataset.transforms.train", "dataset.transforms.eval")
# Hydra's own settings (``hydra.sweep.dir=...``): passed to Hydra, not part of the run's config.
HYDRA_PREFIX = "hydra."
_NOT_OVERRIDABLE = re.compile(r"Could not (?:override|append to config|delete from config)[^']*'([^']+)'")


@dataclass(frozen=True)
class CommandLine:
    """A command line split into Hydra's flags and the overrides.

    overrides: every ``key=value`` word; multirun: ``-m`` / ``--multirun`` was given;
    other_flags: any other Hydra flag (``--cfg``, ``--help``, ...): Hydra handles those itself.
    """

    overrides: list[str]
    multirun: bool
    other_flags: list[str]


LAUNCH_FLAGS = ("--jobs", "--cluster", "--job-cpus")
"""sim.py's own flags (not Hydra's): how a multirun's jobs run (``launch.jobs.Launcher``)."""


def take_launch_flags(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The values that ``--jobs N``, ``--cluster ADDRESS`` and ``--job-cpus K`` give (the last of each
    wins), and the other words of ``argv`` (for Hydra). Either form works: ``--jobs 2`` or ``--jobs=2``."""
    given: dict[str, str] = {}
    rest: list[str] = []
    words = iter(argv)
    for word in words:
        flag, equals, value = word.partition("=")
        if flag not in LAUNCH_FLAGS:
            rest.append(word)
            continue
        value = value if equals else next(words, "")
        if not value:
            raise ConfigError(f"{flag} is invalid: it needs a value, e.g. {flag}=2")
        given[flag] = value
    return given, rest


def split_command_line(argv: Sequence[str]) -> CommandLine:
    """The overrides and flags of ``argv`` (the words after the script's name)."""
    flags = [word for word in argv if word.startswith("-")]
    return CommandLine(overrides=[word for word in argv if not word.startswith("-")],
                       multirun=any(flag in ("-m", "--multirun") for flag in flags),
                       other_flags=[flag for flag in flags if flag not in ("-m", "--multirun")])


def _parse(override: str) -> Override:
    try:
        return OverridesParser.create().parse_overrides([override])[0]
    except HydraException as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{override} is invalid: not an override Hydra can read ({reason}); allowed is "
                          "key=value, +key=value to add a key, ~key to delete one") from None


def _job_words(words: list[str], multirun: bool) -> list[list[str]]:
    """Every job's overrides: one job, or with ``multirun`` the product of the sweeps."""
    choices: list[list[str]] = []
    for word in words:
        override = _parse(word)
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices.append([word])
            continue
        if not multirun:
            raise ConfigError(f"{word} is invalid: a list of values sweeps only in a multirun (add -m), or write "
                              f"it as a list, {key}=[...], or quote it as a string")
        if not override.is_discrete_sweep():
            raise ConfigError(f"{word} is invalid: allowed are discrete sweeps (a,b,c or range(...)); an interval "
                              "needs a sweeper plugin")
        choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return [list(job) for job in itertools.product(*choices)]


def _allowed_under(cfg: DictConfig, key: str) -> str:
    """The keys next to ``key`` in ``cfg`` (what a misspelt key could have meant)."""
    parent = key.rpartition(".")[0]
    if parent in OPEN_MAPPINGS:
        return f"add an entry to {parent} with +{key}=..."
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if isinstance(node, DictConfig):
        return f"allowed under {parent or 'the top level'} are {', '.join(sorted(str(k) for k in node))}"
    return f"{parent} has no settings of its own"


def _value_of(words: Sequence[str], key: str) -> str:
    for word in words:
        if word.lstrip("+~").partition("=")[0] == key:
            return word.lstrip("+~")
    return key


def _blame(words: Sequence[str], err: ConfigError) -> ConfigError:
    """One line for a composition that failed without naming an override: a deletion (``~key``) that
    leaves a setting the config needs, else the error's own first line."""
    reason = str(err).splitlines()[0].split(": ", 1)[-1]
    deletions = [word for word in words if word.startswith("~")]
    if deletions:
        try:
            compose_config([word for word in words if word not in deletions])
        except ConfigError:
            pass
        else:
            return ConfigError(f"{deletions[0]} is invalid: the run needs this setting ({reason})")
    return ConfigError(str(err).splitlines()[0])


def compose_job(words: Sequence[str]) -> DictConfig:
    """The config of one job's overrides; an override Hydra cannot apply is one line naming it and the
    keys it could have meant."""
    run_words = [word for word in words if not word.lstrip("+~").startswith(HYDRA_PREFIX)]
    try:
        return compose_config(run_words)
    except ConfigError as err:
        match = _NOT_OVERRIDABLE.search(str(err))
        cause = err.__cause__
        if match is None or not isinstance(cause, (HydraException, OmegaConfBaseException)):
            raise _blame(run_words, err) from None
        key = match.group(1)
        others = [word for word in run_words if word.lstrip("+~").partition("=")[0] != key]
        base = compose_config(others)
        raise ConfigError(f"{_value_of(run_words, key)} is invalid: no such setting; "
                          f"{_allowed_under(base, key)}") from None


def _check_added_keys(parsed: list[Override], words: list[str]) -> None:
    """``+key`` adds a key nobody reads unless it extends an open mapping; ``++key`` must name a
    setting that exists."""
    for override, word in zip(parsed, words):
        key = override.key_or_group
        if key.startswith(HYDRA_PREFIX) or any(key.startswith(f"{m}.") for m in OPEN_MAPPINGS):
            continue
        if override.type == OverrideType.ADD:
            others = [other for other in words if other != word]
            raise ConfigError(f"{word.lstrip('+')} is invalid: no such setting (+ adds a key the run would not "
                              f"read); {_allowed_under(compose_config(others), key)}")
        if override.type == OverrideType.FORCE_ADD:
            compose_job([other.lstrip("+") if other == word else other for other in words])


def checked_jobs(command: CommandLine) -> list[tuple[list[str], DictConfig]]:
    """Every job of ``command`` with its composed config, each override read, swept and applied
    without an error (the run's own values are checked by the caller, per job)."""
    jobs = []
    for words in _job_words(command.overrides, command.multirun):
        _check_added_keys([_parse(word) for word in words], words)
        jobs.append((words, compose_job(words)))
    return jobs


def for_hydra(argv: Sequence[str]) -> list[str]:
    """``argv`` as Hydra's multirun takes it. Hydra composes a multirun's config once before its jobs,
    with each swept config group at its default and the sweeps left out: a setting that only the swept
    choices have (``-m strategy=fedavg,fedprox strategy.num_rounds=5``: FedCorr, the default, has no
    num_rounds) fails there although every job has it. Such an override becomes ``++key=value``, which
    sets the key in every job as the plain one does (``checked_jobs`` checked each job with the plain
    one). Any other command line is returned as it is."""
    command = split_command_line(argv)
    if not command.multirun:
        return list(argv)
    parsed = {word: _parse(word) for word in command.overrides}
    swept = {override.get_key_element() for override in parsed.values() if override.is_sweep_override()}

    def under_a_sweep(word: str) -> bool:
        override = parsed[word]
        return (override.type == OverrideType.CHANGE and not override.is_sweep_override()
                and any(override.key_or_group.startswith(f"{key}.") for key in swept))

    return [f"++{word}" if not word.startswith("-") and under_a_sweep(word) else word for word in argv]


def one_job(argv: Sequence[str]) -> DictConfig:
    """The checked config of a command that runs one job (``scene.py``, ``export.py``): its overrides
    read and composed (no sweeps, no Hydra flags), and its out_dir a folder it can write."""
    command = split_command_line(argv)
    if command.other_flags or command.multirun:
        flags = " ".join([*command.other_flags, *(["-m"] if command.multirun else [])])
        raise ConfigError(f"{flags} is invalid: this command takes key=value overrides only")
    [(_, cfg)] = checked_jobs(command)
    check_output_folder("out_dir", out_dir(cfg))
    return cfg
