"""The app bundle (FAB) that `flwr run` builds from this checkout and sends to every SuperNode: it holds
what the ServerApp and the ClientApp load, and nothing that grows with the benchmarks' records."""

from __future__ import annotations

import ast
import io
import os
import zipfile
from pathlib import Path

import pathspec
from flwr.cli.build import build_fab_from_files
from flwr.common.constant import FAB_MAX_SIZE

ROOT = Path(__file__).resolve().parents[1]


def checkout_files(root: Path) -> dict[str, Path]:
    """The files `flwr run` would collect from ``root``, without walking the folders .gitignore drops
    (the virtual environment among them), which Flower filters out after collecting anyway."""
    ignored = pathspec.GitIgnoreSpec.from_lines((root / ".gitignore").read_text().splitlines())
    files: dict[str, Path] = {}
    for folder, subfolders, names in os.walk(root):
        here = Path(folder).relative_to(root)
        subfolders[:] = [name for name in subfolders
                         if name != ".git" and not ignored.match_file(f"{(here / name).as_posix()}/")]
        files.update({(here / name).as_posix(): Path(folder) / name for name in names})
    return files


def app_packages() -> set[str]:
    """The project's top-level packages the two apps reach through their imports, the ones inside
    functions included: read from the source, so that what other tests imported into this process
    does not count. A package counts whole, as the registries discover their modules by listing it."""
    local = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    found: set[str] = set()
    todo = ["server", "client"]
    while todo:
        package = todo.pop()
        if package in found:
            continue
        found.add(package)
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                todo.extend(top for top in (name.split(".")[0] for name in names) if top in local)
    return found


def test_the_fab_holds_the_apps_packages_and_configs_and_nothing_else() -> None:
    fab, _ = build_fab_from_files(checkout_files(ROOT))
    packed = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    packages = app_packages()
    assert packages >= {"server", "client", "strategies", "task", "settings"}, packages
    expected = {path.relative_to(ROOT).as_posix() for package in packages
                for path in (ROOT / package).rglob("*.py")}
    expected |= {path.relative_to(ROOT).as_posix() for path in (ROOT / "conf").rglob("*.yaml")}
    expected |= {"pyproject.toml", ".info/CONTENT"}
    assert packed == expected, (f"missing from the FAB: {sorted(expected - packed)}; "
                                f"in it but not imported by the apps: {sorted(packed - expected)}")
    # Flower refuses a larger FAB; the docs' records alone passed 6 MB while they were packed.
    assert len(fab) < FAB_MAX_SIZE / 4, len(fab)
