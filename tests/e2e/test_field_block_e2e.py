"""The field's tables in docs/results.md are what the command shown above them prints from the runs
kept in docs/records: ``bench/records.py restore`` into a fresh outputs folder, then that command
with ``--outputs`` pointed at it, as a reader on another machine would run them."""

from __future__ import annotations

import difflib
import subprocess
import sys

from commands import REPO
from field_doc import RESULTS, shown_command, squeezed


def test_the_field_block_is_what_its_command_prints_from_the_records(tmp_path):
    text = RESULTS.read_text()
    command, _, end = shown_command(text)
    assert command[:2] == [".venv/bin/python", "bench/field_fmnist.py"] and "--report" in command, command
    outputs = tmp_path / "outputs"
    restored = subprocess.run([sys.executable, "bench/records.py", "restore", "--outputs", str(outputs),
                               "--under", "bench-field"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert restored.returncode == 0, restored.stderr[-3000:]
    command[command.index("--outputs") + 1] = str(outputs)
    done = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = squeezed(done.stdout)
    assert printed.startswith("The field on fmnist at comm_budget="), printed[:300]
    after = text[end:]
    if printed not in after:
        first = printed.splitlines()[0]
        kept = after[after.index(first):] if first in after else after
        diff = difflib.unified_diff(kept.splitlines()[: len(printed.splitlines())], printed.splitlines(),
                                    "docs/results.md", "printed now", lineterm="", n=1)
        raise AssertionError("the field block differs from its command's output; make it again with that "
                             "command (runs of blank lines made one):\n" + "\n".join(list(diff)[:60]))
