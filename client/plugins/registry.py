"""Client plug-ins by name, found in this package: every ``ClientPlugin`` subclass of a module here
that declares its own ``name`` registers itself; a new method adds its module and edits nothing else."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from pathlib import Path

from client.plugins.base import ClientPlugin

PLAIN = ClientPlugin()


@functools.cache
def plugins() -> dict[str, ClientPlugin]:
    """Every registered plug-in by name, plain training (``""``) first."""
    found = {PLAIN.name: PLAIN}
    for module_name in sorted(info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])):
        module = importlib.import_module(f"client.plugins.{module_name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, ClientPlugin) and cls is not ClientPlugin and cls.__module__ == module.__name__ \
                    and "name" in vars(cls):
                found[cls.name] = cls()
    return found


def plugin(name: str) -> ClientPlugin:
    """The plug-in ``name``; an unknown one is an error naming the known ones."""
    found = plugins()
    if name not in found:
        known = ", ".join(repr(known) for known in found)
        raise ValueError(f"the server asked for client plug-in {name!r}; this node knows {known}")
    return found[name]
