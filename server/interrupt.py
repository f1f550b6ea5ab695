"""What Ctrl-C does to a run in this process: it stops within seconds, leaves no Ray process behind,
and says in one line where the run stopped and how to continue it.

The first SIGINT raises KeyboardInterrupt in the main thread as usual: Flower's runtime stops its
workers and Ray, and the command prints ``stopped_line`` and leaves at once (``exit_now``), without
waiting for the ServerApp thread, which would otherwise wait for replies that no longer come. Every
results file is written whole or appended a line at a time (readers skip a line cut short), so a stop
at any instant leaves them valid. A second SIGINT while the first is being handled says what is
happening instead of interrupting the clean-up; a third leaves at once.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from common.run_files import read_rounds
from server.checkpoints import CheckpointStore

INTERRUPTED = 130
"""The exit status of a command stopped by SIGINT (128 + 2), as shells report it."""


def exit_now(status: int) -> NoReturn:
    """Flush both streams and end the process with ``status``, without waiting for other threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _first(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, _second)
    raise KeyboardInterrupt


def _second(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, _third)
    print("stopping: Ray is shutting down (a few seconds); Ctrl-C again ends at once and may leave its "
          "processes running", file=sys.stderr)


def _third(signum: int, frame: FrameType | None) -> None:
    print("stopped by a third Ctrl-C before Ray had shut down; the run's files are as its last finished round "
          "left them", file=sys.stderr)
    exit_now(INTERRUPTED)


def handle_interrupts() -> None:
    """From now on the first Ctrl-C raises KeyboardInterrupt, a second one says that the clean-up is
    under way (instead of a traceback from wherever it was) and a third ends the process at once. A
    SIGINT that whoever started the process ignores (a script's background job) stays ignored. Main
    thread only."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _first)


def stopped_line(out_dir: str | Path) -> str:
    """``stopped by Ctrl-C after round 12 (...)``: the last finished round in ``out_dir`` and what a
    resume continues from."""
    rounds = read_rounds(out_dir)
    done = f"after round {rounds[-1]['round']}" if rounds else "before its first round finished"
    kept = CheckpointStore(out_dir).rounds()
    if kept:
        how = (f"its latest checkpoint is of round {kept[-1]}: the same command with resume=true continues "
               f"from there")
    else:
        how = "it has no checkpoint yet: the same command starts it again"
    return f"stopped by Ctrl-C {done}; results so far in {out_dir}; {how}"
