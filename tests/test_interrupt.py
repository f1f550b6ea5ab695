"""The one line a run stopped by Ctrl-C ends with: the last finished round, where the results are, and
what the same command with resume=true continues from (end to end: tests/e2e/test_interrupt_e2e.py)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import time

import pytest

from server.checkpoints import CHECKPOINTS
from server.interrupt import INTERRUPTED, TERMINATED, handle_interrupts, stopped_by, stopped_line


def test_the_line_names_the_last_round_and_the_checkpoint_a_resume_continues_from(tmp_path):
    rows = "".join(json.dumps({"round": r}) + "\n" for r in (1, 2, 3)) + '{"round": 4, "te'  # round 4 cut short
    (tmp_path / "rounds.jsonl").write_text(rows)
    (tmp_path / CHECKPOINTS).mkdir()
    for name in ("round-1-stage.ckpt", "round-2.ckpt"):
        (tmp_path / CHECKPOINTS / name).touch()
    assert stopped_line(tmp_path) == (f"stopped by Ctrl-C after round 3; results so far in {tmp_path}; its "
                                      "latest checkpoint is of round 2: the same command with resume=true continues "
                                      "from there")


def test_a_run_stopped_before_its_first_checkpoint_starts_again(tmp_path):
    assert stopped_line(tmp_path) == (f"stopped by Ctrl-C before its first round finished; results so far in "
                                      f"{tmp_path}; it has no checkpoint yet: the same command starts it again")


@pytest.fixture
def interrupts():
    """``handle_interrupts`` for one test; puts back the SIGINT and SIGTERM handlers, the unraisable hook
    and Flower's log as they were."""
    handler, hook, muted = signal.getsignal(signal.SIGINT), sys.unraisablehook, logging.getLogger("flwr").disabled
    term = signal.getsignal(signal.SIGTERM)
    yield handle_interrupts
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, term)
    sys.unraisablehook = hook
    logging.getLogger("flwr").disabled = muted


def test_the_first_ctrl_c_interrupts_and_mutes_flower_and_the_second_does_not(interrupts, capsys):
    """The second SIGINT arrives while the first one's clean-up runs: it must not raise into it."""
    interrupts()
    assert not logging.getLogger("flwr").disabled
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert logging.getLogger("flwr").disabled
    signal.raise_signal(signal.SIGINT)  # no exception: the clean-up goes on
    assert "stopping: Ray is shutting down" in capsys.readouterr().err


def test_sigterm_unwinds_the_run_as_an_exit_the_command_knows_and_mutes_flower(interrupts):
    interrupts()
    with pytest.raises(SystemExit) as stopped:
        signal.raise_signal(signal.SIGTERM)
    assert stopped_by(stopped.value) == ("SIGTERM", TERMINATED)
    assert stopped_by(KeyboardInterrupt()) == ("Ctrl-C", INTERRUPTED)
    assert stopped_by(SystemExit(2)) is None and stopped_by(SystemExit()) is None
    assert logging.getLogger("flwr").disabled


def test_the_line_says_what_stopped_the_run(tmp_path):
    assert stopped_line(tmp_path, "SIGTERM").startswith("stopped by SIGTERM before its first round finished; ")


class _CtrlCInFinaliser:
    """Ctrl-C pressed while a finaliser runs: Python cannot raise out of it and drops the exception, as
    it does in the at-fork callbacks that run while Ray starts its processes."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def test_a_first_ctrl_c_that_python_drops_is_delivered_again(interrupts, capsys):
    interrupts()
    with pytest.raises(KeyboardInterrupt):
        _CtrlCInFinaliser()
        for _ in range(100):  # the main thread runs on; the Ctrl-C must reach it all the same
            time.sleep(0.01)
    assert "Exception ignored" not in capsys.readouterr().err
    signal.raise_signal(signal.SIGINT)  # now a second Ctrl-C: it does not raise


def test_other_dropped_exceptions_are_still_reported(interrupts, capsys):
    class Failing:
        def __del__(self) -> None:
            raise ValueError("lost in a finaliser")

    interrupts()
    Failing()
    assert "lost in a finaliser" in capsys.readouterr().err


def test_an_ignored_sigint_stays_ignored(interrupts):
    """A script's background job is started with SIGINT ignored; the run keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupts()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
