"""Checks of the folders a command writes to, before it writes anything."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from common.errors import InvalidValue


def check_output_folder(key: str, value: object) -> None:
    """``value`` must be a folder this process can create (or already has) and write in: not empty,
    not a file, not under a file, and its nearest existing folder writable."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue(key, value, "allowed is a folder path")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise InvalidValue(key, value, "allowed is a folder; this path is a file")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InvalidValue(key, value, f"allowed is a folder that can be created; {existing} is a file")
    # Tried, not inferred from permission bits: root passes os.access on read-only places (/proc,
    # a read-only mount) where creating a folder still fails. The probe folder is removed at once.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as err:
        where = "it" if existing == path.absolute() else f"its nearest existing folder {existing}"
        raise InvalidValue(key, value, f"allowed is a folder this user can write in; {where} is not writable "
                                       f"({err.strerror})") from None
