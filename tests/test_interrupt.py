"""The one line a run stopped by Ctrl-C ends with: the last finished round, where the results are, and
what the same command with resume=true continues from (end to end: tests/e2e/test_interrupt_e2e.py)."""

from __future__ import annotations

import json
import signal

import pytest

from server.checkpoints import CHECKPOINTS
from server.interrupt import handle_interrupts, stopped_line


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


def test_the_first_ctrl_c_interrupts_and_the_second_does_not(capsys):
    """The second SIGINT arrives while the first one's clean-up runs: it must not raise into it."""
    before = signal.getsignal(signal.SIGINT)
    try:
        handle_interrupts()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # no exception: the clean-up goes on
        assert "stopping: Ray is shutting down" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_sigint_stays_ignored():
    """A script's background job is started with SIGINT ignored; the run keeps it so."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handle_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
