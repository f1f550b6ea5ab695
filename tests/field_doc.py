"""The field's block in docs/results.md: the report command shown under its heading, and that
command's output as the docs keep it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
HEADING = "#### The field at both budgets so far"


def shown_command(text: str) -> tuple[list[str], int, int]:
    """The first ``bash`` block after the field's heading, as words, and where that heading and the
    block's end are in ``text``."""
    heading = text.index(HEADING)
    start = text.index("```bash\n", heading) + len("```bash\n")
    end = text.index("```", start)
    return shlex.split(text[start:end].replace("\\\n", " ")), heading, end


def listed(command: list[str], flag: str) -> list[str]:
    """The values ``command`` gives ``flag`` (up to the next flag)."""
    start = command.index(flag) + 1
    end = next((at for at in range(start, len(command)) if command[at].startswith("--")), len(command))
    return command[start:end]


def squeezed(printed: str) -> str:
    """The command's output as the docs keep it: runs of blank lines made one."""
    return re.sub(r"\n{3,}", "\n\n", printed).strip()
