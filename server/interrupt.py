"""What Ctrl-C does to a run in this process: it stops within seconds, leaves no Ray process behind,
and says in one line where the run stopped and how to continue it.

The first SIGINT raises KeyboardInterrupt in the main thread as usual and mutes Flower's log (its
workers would report every message cut short as an error). Flower's runtime stops its workers and
Ray, and the command prints ``stopped_line`` and leaves at once (``exit_now``), without waiting for
the ServerApp thread, which would otherwise wait for replies that no longer come. Every results file
is written whole or appended a line at a time (readers skip a line cut short), so a stop at any
instant leaves them valid. A second SIGINT while the first is being handled says what is happening
instead of interrupting the clean-up; a third leaves at once.

SIGTERM, which a scheduler sends at a job's time limit or on preemption, unwinds the run as a
``SystemExit``: Ray shuts down on the way out and the command says where the run stopped, with its
own exit status (``TERMINATED``).

Python drops an exception raised where nothing can receive it (an at-fork callback while Ray starts
its processes, a finaliser) and only prints it as "Exception ignored". A first Ctrl-C lost that way
is delivered again, as a fresh SIGINT, 50 ms after it is dropped.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import NoReturn

from common.run_files import read_rounds
from server.checkpoints import CheckpointStore

INTERRUPTED = 130
"""The exit status of a command stopped by SIGINT (128 + 2), as shells report it."""
TERMINATED = 143
"""The exit status of a command stopped by SIGTERM (128 + 15): a scheduler's preemption or time limit."""


def exit_now(status: int) -> NoReturn:
    """Flush both streams and end the process with ``status``, without waiting for other threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _first(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, _second)
    # Flower's worker threads report each message that Ray's shutdown cuts short as an error with a
    # traceback; after a Ctrl-C those are expected, not news.
    logging.getLogger("flwr").disabled = True
    raise KeyboardInterrupt


def _second(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGINT, _third)
    print("stopping: Ray is shutting down (a few seconds); Ctrl-C again ends at once and may leave its "
          "processes running", file=sys.stderr)


def _third(signum: int, frame: FrameType | None) -> None:
    print("stopped by a third Ctrl-C before Ray had shut down; the run's files are as its last finished round "
          "left them", file=sys.stderr)
    exit_now(INTERRUPTED)


_dropped = threading.Event()
_DELIVERER = "deliver-dropped-ctrl-c"


def _deliver_dropped() -> None:
    """A daemon thread's loop: each time a first Ctrl-C is dropped, send SIGINT to the main thread again
    a moment later, when it is back in ordinary code (raised from the hook itself, it would be dropped
    with the hook's own errors)."""
    while True:
        _dropped.wait()
        _dropped.clear()
        time.sleep(0.05)
        _thread.interrupt_main(signal.SIGINT)


def _redeliver(unraisable: sys.UnraisableHookArgs) -> None:
    """Deliver again a first Ctrl-C that Python dropped; report any other dropped exception as usual."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is _second:
        signal.signal(signal.SIGINT, _first)
        _dropped.set()
        return
    sys.__unraisablehook__(unraisable)


def _terminated(signum: int, frame: FrameType | None) -> None:
    logging.getLogger("flwr").disabled = True  # as after a Ctrl-C: the messages cut short are expected
    raise SystemExit(signum)


def handle_interrupts() -> None:
    """From now on the first Ctrl-C raises KeyboardInterrupt, a second one says that the clean-up is
    under way (instead of a traceback from wherever it was) and a third ends the process at once. A
    SIGINT that whoever started the process ignores (a script's background job) stays ignored. A first
    Ctrl-C that Python drops is sent again (see the module's docstring). SIGTERM (a scheduler's
    preemption) raises ``SystemExit(SIGTERM)``, as Ray's own handler does once Ray has started in the
    process, so the run unwinds, Ray shuts down and the command can say where it stopped
    (``stopped_by``). Main thread only."""
    signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _first)
        sys.unraisablehook = _redeliver
        if not any(thread.name == _DELIVERER for thread in threading.enumerate()):
            threading.Thread(target=_deliver_dropped, name=_DELIVERER, daemon=True).start()


def stopped_by(stop: BaseException) -> tuple[str, int] | None:
    """What stopped the command and its exit status: ``("Ctrl-C", INTERRUPTED)`` for a KeyboardInterrupt,
    ``("SIGTERM", TERMINATED)`` for the unwinding of a SIGTERM (``handle_interrupts``, ``ray.init``'s
    handler or the launcher's), None for anything else."""
    if isinstance(stop, KeyboardInterrupt):
        return "Ctrl-C", INTERRUPTED
    if isinstance(stop, SystemExit) and stop.code == signal.SIGTERM:
        return "SIGTERM", TERMINATED
    return None


def stopped_line(out_dir: str | Path, by: str = "Ctrl-C") -> str:
    """``stopped by Ctrl-C after round 12 (...)``: the last finished round in ``out_dir`` and what a
    resume continues from; ``by``: what stopped it."""
    rounds = read_rounds(out_dir)
    done = f"after round {rounds[-1]['round']}" if rounds else "before its first round finished"
    kept = CheckpointStore(out_dir).rounds()
    if kept:
        how = (f"its latest checkpoint is of round {kept[-1]}: the same command with resume=true continues "
               f"from there")
    else:
        how = "it has no checkpoint yet: the same command starts it again"
    return f"stopped by {by} {done}; results so far in {out_dir}; {how}"
