"""A benchmark with ``--jobs 2``: its runs as separate ``sim.py`` processes two at a time, a FedCorr run
that shares stages 1-2 started after its source, and each run of a longer budget after the same run
at the shorter one, which it continues; each result equal to the same run made alone from round 0
(the in-process run, which equals the Ray simulation bit for bit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import inprocess
from commands import REPO

sys.path.insert(0, str(REPO / "bench"))
from field_fmnist import cell_run  # noqa: E402

COLUMNS = ["fedcorr", "fedcorr+poc"]
BUDGET = 60  # smoke FedCorr: stages 1-2 spend 45 participations, stage 3 five rounds of 3
LONGER = 75  # five more rounds, continuing the runs of BUDGET
EXTRA = ["strategy.train.epochs=1"]  # how runs are launched and shared does not depend on how long clients train


def _rounds(payload: dict) -> list[tuple]:
    return [(r["round"], r["stage"], r["clients"], r["test_acc"], r["train_loss"]) for r in payload["rounds"]]


def test_a_bench_runs_its_runs_two_at_a_time_with_the_results_of_serial_runs(tmp_path):
    done = subprocess.run([sys.executable, "bench/field_fmnist.py", "--experiment", "smoke",
                           "--budget", str(BUDGET), str(LONGER), "--cells", "corr-iid", "--columns", *COLUMNS,
                           "--more-seeds", "--jobs", "2", "--outputs", str(tmp_path), *EXTRA],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {column: cell_run("corr-iid", column, 1, BUDGET, "smoke", EXTRA, str(tmp_path)) for column in COLUMNS}
    folder = {column: next(w for w in words if w.startswith("out_dir=")).partition("=")[2]
              for column, words in runs.items()}
    longer = {column: folder[column].replace(f"budget{BUDGET}", f"budget{LONGER}") for column in COLUMNS}
    # Each run went through the launcher, after the run it needs: FedCorr at the longer budget continued
    # its shorter run, and FedCorr+PoC at both budgets took stages 1-2 from the shorter FedCorr run (the
    # shorter FedCorr+PoC run took rounds from another run, so it cannot be continued).
    started = [line for line in done.stdout.splitlines() if "] starting: " in line]
    assert [line.partition("]")[0][1:] for line in started] == [folder["fedcorr"], folder["fedcorr+poc"],
                                                                 longer["fedcorr"], longer["fedcorr+poc"]]
    extended = json.loads((Path(longer["fedcorr"]) / "results.json").read_text())
    short = json.loads((Path(folder["fedcorr"]) / "results.json").read_text())
    assert extended["config"]["extend_from"] == folder["fedcorr"]
    assert _rounds(extended)[:len(_rounds(short))] == _rounds(short)
    assert len(_rounds(extended)) == len(_rounds(short)) + (LONGER - BUDGET) // 3
    longer_poc = json.loads((Path(longer["fedcorr+poc"]) / "results.json").read_text())
    assert longer_poc["config"]["strategy"]["stages12_from"] == folder["fedcorr"]
    shared = json.loads((Path(folder["fedcorr+poc"]) / "results.json").read_text())
    assert shared["config"]["strategy"]["stages12_from"] == folder["fedcorr"]
    alone = inprocess.run([*runs["fedcorr+poc"], f"out_dir={tmp_path / 'alone'}"])
    assert _rounds(shared) == _rounds(alone)
    first = json.loads((Path(folder["fedcorr"]) / "results.json").read_text())
    stages12 = [row for row in _rounds(alone) if row[1] != "usual"]
    assert stages12 and _rounds(first)[:len(stages12)] == stages12, "the source's stages 1-2 are the same rounds"
    assert "time saved:" in done.stdout
