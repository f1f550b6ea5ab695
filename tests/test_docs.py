"""The docs name only what the repository holds: links resolve inside it, every config file they name
exists, the preset table lists every preset file, and the field's counts are those of its records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from field_doc import HEADING, RESULTS, listed, shown_command

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RUN_FOLDER = re.compile(r"outputs/[\w./+-]+-[0-9a-f]{8}\b")
CONF_PATH = re.compile(r"`(conf/[\w/.-]+\.yaml)`")
PRESET_ROW = re.compile(r"^\| `(\w+\.yaml)` \|", re.MULTILINE)


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_links_resolve_inside_the_repository(doc: Path) -> None:
    """A relative link points at a file of the repository (not at a sibling folder a user lacks)."""
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        resolved = (doc.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{_name(doc)} links outside the repository: {target}"
        assert resolved.exists(), f"{_name(doc)} links to a missing file: {target}"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_no_reference_to_files_outside_the_repository(doc: Path) -> None:
    """Provenance is stated in the docs themselves, not by a path above the checkout."""
    assert "../shared" not in doc.read_text(), f"{_name(doc)} names a file outside the repository"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_named_config_files_exist(doc: Path) -> None:
    """Every `conf/...yaml` a doc names in code quotes is a file of conf/."""
    missing = [path for path in CONF_PATH.findall(doc.read_text()) if not (ROOT / path).is_file()]
    assert not missing, f"{_name(doc)} names config files that do not exist: {missing}"


def test_preset_table_lists_exactly_the_preset_files() -> None:
    """configuration.md's preset table has one row per file of conf/preset/, and no row for a file that
    is not there."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("### preset", 1)[1].split("\n## ", 1)[0]
    listed = set(PRESET_ROW.findall(section))
    on_disk = {path.name for path in (ROOT / "conf" / "preset").glob("*.yaml")}
    assert listed == on_disk, f"only in the table: {sorted(listed - on_disk)}; undocumented: {sorted(on_disk - listed)}"


SHOWN_RUNS = {"README.md": [], "docs/configuration.md": [],
              "docs/first-hour.md": ["experiment=smoke", "strategy=fedcorr"]}
"""The docs that show a default run folder, and the overrides of the run they show."""


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_a_run_folder_a_doc_shows_is_where_that_run_writes(doc: Path) -> None:
    """A default folder in the docs (its digest included) is the folder the run it names writes to now,
    so a command that reads it (``strategy.stages12_from=...``) finds the run."""
    from settings.compose import compose_config

    shown = set(RUN_FOLDER.findall(doc.read_text()))
    if _name(doc) not in SHOWN_RUNS:
        assert not shown, f"{_name(doc)} shows run folders; add it and its run's overrides to SHOWN_RUNS"
        return
    assert shown == {compose_config(SHOWN_RUNS[_name(doc)]).out_dir}, _name(doc)


def test_the_field_counts_its_finished_runs_as_the_records_hold_them() -> None:
    """The paragraph under the field's heading says how many of the planned runs each budget has; those
    are the records in docs/records of the cells, columns and seeds its command names."""
    text = RESULTS.read_text()
    command, heading, end = shown_command(text)
    cells, columns, seeds = (listed(command, flag) for flag in ("--cells", "--columns", "--seeds"))
    planned = len(cells) * len(columns) * len(seeds)
    records = ROOT / "docs" / "records" / "bench-field"
    said = " ".join(text[heading:end].split())
    assert said.startswith(HEADING)
    for budget in listed(command, "--budget"):
        kept = sum((records / f"fmnist-budget{budget}" / cell / f"seed{seed}" / f"{column}.json").is_file()
                   for cell in cells for column in columns for seed in seeds)
        assert re.search(rf"\b{kept} of {planned} (runs )?at {int(budget):,}\b", said), (
            f"docs/records holds {kept} of the {planned} runs at {budget}; the paragraph above the command says: "
            f"{said[:400]}")
