"""Lines of configuration, registry and validation code in a checkout (a measure, not a test).

    .venv/bin/python bench/wiring_lines.py [ROOT]

Counts, from the source text: whole files whose job is configuration, registries or validation;
in every other module, the settings dataclasses (those whose fields declare constraints) and the
wiring functions that turn a config block into a strategy or a plug-in; and the constructors of the
strategies. Blank lines and comments are not counted; docstrings are.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

WHOLE_FILES = (
    "common/validation.py", "strategies/registry.py", "strategies/environment.py", "strategies/context.py",
    "strategies/rounds.py", "server/config.py", "settings/run.py", "settings/scene.py", "settings/compose.py",
    "client/plugins.py", "client/plugins/base.py", "client/plugins/registry.py", "data/registry.py",
)
PACKAGES = ("common", "data", "models", "task", "settings", "protocol", "strategies", "client", "server")
WIRING_FUNCTIONS = {"_parse", "_check", "_build", "_arguments", "_feddyn_arguments", "check_pool", "round_entry"}
WIRING_NAMES = {"STRATEGY", "METHOD", "_METHOD", "_ROUNDS", "PLUGIN"}
DECLARATION_MARKS = ("rule(", "option(", "check_fields(")


def code_lines(lines: list[str]) -> int:
    """Lines that are neither blank nor comments."""
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def node_lines(source: list[str], node: ast.AST) -> list[str]:
    """The source lines of a top-level node, its decorators included."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return source[start - 1:node.end_lineno]


def is_strategy_class(node: ast.ClassDef) -> bool:
    """Whether a class derives from FedAvg or FederatedStrategy by name."""
    return any(isinstance(base, ast.Name) and base.id in {"FedAvg", "FederatedStrategy"} for base in node.bases)


def module_counts(path: Path) -> dict[str, int]:
    """A module's lines of settings classes, wiring functions and strategy constructors."""
    source = path.read_text().splitlines()
    tree = ast.parse("\n".join(source))
    counts = {"settings classes": 0, "wiring functions": 0, "strategy constructors": 0}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            text = "\n".join(node_lines(source, node))
            is_dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
            if is_dataclass and any(mark in text for mark in DECLARATION_MARKS):
                counts["settings classes"] += code_lines(node_lines(source, node))
            if is_strategy_class(node):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        counts["strategy constructors"] += code_lines(node_lines(source, item))
        elif isinstance(node, ast.FunctionDef) and node.name in WIRING_FUNCTIONS:
            counts["wiring functions"] += code_lines(node_lines(source, node))
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in WIRING_NAMES
                                                  for t in node.targets):
            counts["wiring functions"] += code_lines(node_lines(source, node))
    return counts


def main(root: Path) -> None:
    """Print the counts of the checkout at ``root``."""
    whole = {name: code_lines((root / name).read_text().splitlines())
             for name in WHOLE_FILES if (root / name).is_file()}
    totals = {"settings classes": 0, "wiring functions": 0, "strategy constructors": 0}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if str(path.relative_to(root)) in whole:
                continue
            for key, value in module_counts(path).items():
                totals[key] += value
    for name, count in whole.items():
        print(f"{count:6d}  {name}")
    for key, value in totals.items():
        print(f"{value:6d}  {key} (in the other modules)")
    print(f"{sum(whole.values()) + sum(totals.values()):6d}  in all")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
