"""Resume after a kill, in process: every strategy killed mid-run (mid-round: some nodes have already
written this round's state) and resumed ends exactly as an uninterrupted run; FedCorr from each of its
stages; a run that takes another run's stages 1-2; a run that extends a shorter run of its config; the
checkpoint store, the nodes' state versions and the strategy state interface. The SIGKILL tests of real
processes are in tests/e2e."""

from __future__ import annotations

import csv
import json
import pickle
import shutil
from collections import Counter
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from grid import Killed, LocalGrid

from client.state_store import admitted, enter, load_record, save_record, versions
from common.errors import ConfigError
from common.run_files import read_payload
from protocol.messages import HELD, StateScope, with_scope
from reports.runs import find_runs
from server.checkpoints import Checkpoint, CheckpointStore, Lineage, read_checkpoint
from server.config import load_run
from server.discovery import discover
from server.results import ARRAY_FILES, ResultsWriter
from server.run import initial_model, run_server
from settings.compose import compose_config
from strategies.registry import strategy_classes

# One local epoch: what a resume must reproduce does not depend on how long clients train.
SMOKE = "experiment=smoke ground_truth=true server.checkpoint_every=2 strategy.train.epochs=1"

# Each stateful strategy's smoke run, small enough for the fast tier.
RUNS = {
    "fedavg": "strategy=fedavg strategy.num_rounds=4",
    "fedprox": "strategy=fedprox strategy.num_rounds=4",
    "fedmedian": "strategy=fedmedian strategy.num_rounds=4",
    "fedlsr": "strategy=fedlsr strategy.num_rounds=4",
    "feddyn": "strategy=feddyn strategy.num_rounds=5",
    "scaffold": "strategy=scaffold strategy.num_rounds=4",
    "rfa": "strategy=rfa strategy.num_rounds=4",
    "poc": "strategy=poc strategy.num_rounds=4",
    "fednoro": "strategy=fednoro strategy.num_rounds=6",
    "feddiv": "strategy=feddiv strategy.num_rounds=2",
    "fedes": "strategy=fedes strategy.num_rounds=5",
    "fedcorr": "strategy=fedcorr strategy.t1=1 strategy.t2=2 strategy.t3=2 strategy.stage3=feddyn",
}


@pytest.fixture
def run_at(flower_identity, tmp_path):
    """``run_at(overrides, folder, kill_at=None) -> (payload, grid)``: a whole run of the ServerApp
    logic into ``tmp_path/folder``, on fresh nodes (a restarted process); with ``kill_at`` it dies
    before that message and returns (None, grid)."""
    from client.app import app as client_app

    def run(overrides: str, folder: str, kill_at: int | None = None):
        words = [*f"{SMOKE} {overrides}".split(), f"out_dir={tmp_path / folder}"]
        plan = load_run(compose_config(words))
        grid = LocalGrid(client_app, num_nodes=plan.settings.num_clients, run_config={"overrides": " ".join(words)},
                         kill_at=kill_at)
        try:
            return run_server(grid, plan), grid
        except Killed:
            return None, grid

    return run


def comparable(payload: dict[str, Any]) -> dict[str, Any]:
    """A results payload without what differs between two runs of one config: timings, out_dir, resume,
    and when and how each attempt was started."""
    payload = json.loads(json.dumps(payload))
    payload["summary"].pop("wall_s")
    payload.pop("attempts")
    payload.pop("provenance")
    for row in payload["rounds"]:
        row.pop("elapsed_s")
    for key in ("out_dir", "resume", "extend_from"):
        payload["config"].pop(key)
    payload["config"]["strategy"].pop("stages12_from", None)
    return payload


def client_tables(folder: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(folder.glob("*_clients.csv"))}


def array_files(folder: Path) -> dict[str, bytes]:
    """The run's array files beside results.json (``confusion.npz``), byte for byte."""
    return {name: (folder / name).read_bytes() for name in ARRAY_FILES if (folder / name).is_file()}


def assert_same_run(resumed: dict[str, Any], reference: dict[str, Any], tmp_path: Path, folders: tuple[str, str]):
    assert comparable(resumed) == comparable(reference)
    assert client_tables(tmp_path / folders[0]) == client_tables(tmp_path / folders[1])
    assert array_files(tmp_path / folders[0]) == array_files(tmp_path / folders[1])
    rows = [json.loads(line) for line in (tmp_path / folders[0] / "rounds.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [row["round"] for row in reference["rounds"]]
    with open(tmp_path / folders[0] / "rounds.csv") as table:
        assert [int(row["round"]) for row in csv.DictReader(table)] == [row["round"] for row in reference["rounds"]]


# One of each kind of state: FedCorr's stages with FedDyn's nodes' state in stage 3, FedDiv's filter and
# priors, SCAFFOLD's control variates, PoC's losses. The SIGKILL tests of real processes
# (tests/e2e/test_resume_strategies_e2e.py) add FedNoRo's and FedES's and repeat FedDiv's and SCAFFOLD's.
# And FedCorr with 3 of 10 clients joining at stage 2 and taking an iteration of their own (rounds 8-10).
KILLED = {**{name: RUNS[name] for name in ("fedcorr", "feddiv", "poc", "scaffold")},
          "fedcorr-late": f"{RUNS['fedcorr']} participation.late=0.3 participation.join_round=8 "
                          "strategy.joiners=preprocess strategy.client_score=mean"}


@pytest.mark.parametrize("name", KILLED)
def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_result(run_at, tmp_path, name):
    reference, whole = run_at(KILLED[name], "reference")
    rounds = len(reference["rounds"])
    # Die about two thirds in, in the middle of a round's deliveries.
    kill_at = 10 + (len(whole.delivered) - 10) * 2 // 3
    killed, grid = run_at(KILLED[name], "resumed", kill_at=kill_at)
    assert killed is None and len(grid.delivered) == kill_at
    store = CheckpointStore(tmp_path / "resumed")
    assert store.latest() is not None and max(store.rounds()) < rounds, "killed after a checkpoint, before the end"
    resumed, _ = run_at(f"{KILLED[name]} resume=true", "resumed")
    assert_same_run(resumed, reference, tmp_path, ("resumed", "reference"))
    if name == "fedcorr-late":  # the joiners' own iteration ran
        assert len(reference["fedcorr"]["iterations"]) == 2
    if name == "fedcorr":  # its clients' confusion counts, half of them sent before the kill
        assert "confusion.npz" in array_files(tmp_path / "resumed")


def test_a_stopped_run_shows_its_methods_blocks_as_of_its_last_checkpoint(run_at, tmp_path):
    """Killed in stage 3 (PoC), a FedCorr run's results.json (not complete) already holds its stage-1
    detection and the clients stage 2 finetuned on, as the whole run reports them, and stage 3's
    block as of its last checkpoint, not of stage 2's end."""
    overrides = RUNS["fedcorr"].replace("stage3=feddyn", "stage3=poc") + " strategy.t3=4"
    reference, whole = run_at(overrides, "reference")
    assert run_at(overrides, "killed", kill_at=len(whole.delivered) - 1)[0] is None
    last = max(CheckpointStore(tmp_path / "killed").rounds())
    assert [row["stage"] for row in reference["rounds"]][last - 1] == "usual", "killed in stage 3"
    stopped = read_payload(tmp_path / "killed")
    reported = json.loads(json.dumps(reference["fedcorr"]))
    assert stopped["complete"] is False
    for key in ("iterations", "detected_noisy_clients", "finetune_clients"):
        assert stopped["fedcorr"][key] == reported[key], key
    assert 0 < stopped["poc"]["loss_queries"] < reference["poc"]["loss_queries"], "some stage-3 rounds, not all"
    # Resumed and killed again before its first round (10 discovery, 10 held queries): still there.
    assert run_at(f"{overrides} resume=true", "killed", kill_at=20)[0] is None
    again = read_payload(tmp_path / "killed")
    assert (again["fedcorr"], again["poc"]) == (stopped["fedcorr"], stopped["poc"])


def test_a_fresh_run_leaves_no_array_file_of_an_earlier_run_in_its_folder(run_at, tmp_path):
    run_at(RUNS["fedcorr"], "run")
    assert "confusion.npz" in array_files(tmp_path / "run")
    assert run_at(f"{RUNS['fedcorr']} ground_truth=false", "run", kill_at=12)[0] is None
    assert array_files(tmp_path / "run") == {}, "a fresh start removes it at once"


def test_a_second_kill_after_a_resume_still_resumes_identically(run_at, tmp_path):
    overrides = RUNS["feddyn"]
    reference, whole = run_at(overrides, "reference")
    # Killed in round 3 (checkpoint of round 2), resumed, killed again in round 5 (checkpoint of round 4):
    # the resumed attempt sends 10 discovery and 10 held queries before its rounds.
    for kill_at, again in ((18, ""), (27, " resume=true")):
        assert run_at(overrides + again, "resumed", kill_at=kill_at)[0] is None
    resumed, _ = run_at(f"{overrides} resume=true", "resumed")
    assert_same_run(resumed, reference, tmp_path, ("resumed", "reference"))
    assert resumed["attempts"] == {"resumed_at": [2, 4], "stages12_from": None, "extended_from": None}
    # One provenance record per attempt, oldest first: the two killed ones kept through their checkpoints.
    assert len(resumed["provenance"]) == 3
    started = [record["started"] for record in resumed["provenance"]]
    assert started == sorted(started)
    # The nodes' state carries the attempts' numbers; nothing a dead attempt wrote after its resume point is left.
    record = CheckpointStore(tmp_path / "resumed").record()
    assert record is not None and len(record.lineage.resumed_at) == 2
    for folder in (tmp_path / "resumed" / "client_state").glob("run-*/partition-*/*"):
        assert all(admitted(version, record.lineage.resumed_at) for version in versions(folder))


def test_stages12_from_runs_only_stage3_and_equals_a_whole_run(run_at, tmp_path):
    base = "strategy=fedcorr strategy.t1=1 strategy.t2=2"
    run_at(f"{base} strategy.t3=1", "source")
    reference, _ = run_at(f"{base} strategy.t3=3 strategy.stage3=feddyn", "whole")
    taken, grid = run_at(f"{base} strategy.t3=3 strategy.stage3=feddyn strategy.stages12_from={tmp_path / 'source'}",
                         "taken")
    assert_same_run(taken, reference, tmp_path, ("taken", "whole"))
    trained = [message for message in grid.delivered if message.metadata.message_type == "train"]
    assert len(trained) == 3 * 3, "stage 3's rounds only: 3 rounds of 3 clients"
    record = CheckpointStore(tmp_path / "taken").record()
    source = CheckpointStore(tmp_path / "source").record()
    assert record is not None and source is not None and record.lineage.parent == source.lineage.run
    taken_from = taken["attempts"]["stages12_from"]
    assert taken_from["round"] == 12 and taken_from["elapsed_s"] == taken["rounds"][11]["elapsed_s"]


def test_stages12_from_refuses_a_run_whose_stages_1_2_differ(run_at, tmp_path):
    run_at("strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=0", "source")
    words = [*SMOKE.split(), "strategy=fedcorr", "strategy.t1=1", "strategy.t2=1", "strategy.pi=0.4",
             f"strategy.stages12_from={tmp_path / 'source'}", f"out_dir={tmp_path / 'other'}"]
    with pytest.raises(ConfigError, match=r"strategy.stages12_from=.* is invalid: a run whose stages 1-2 match "
                                          r"this run's; differing: strategy.pi \(0.5 -> 0.4\)"):
        load_run(compose_config(words))
    with pytest.raises(ConfigError, match="it holds no node state|has no checkpoints/run.json"):
        load_run(compose_config([*words[:5], f"strategy.stages12_from={tmp_path}", f"out_dir={tmp_path / 'x'}"]))
    assert not (tmp_path / "other").exists()


# Strategies whose early rounds do not depend on the budget, each at two budgets; the shorter run ends in
# the method's last phase: FedCorr's stage 3 (FedDyn, with its nodes' state), FedDiv's main phase after
# its warm-up, FedES's SeGD rounds after its estimation round (which averages the weights by their mean:
# the mixture fits of its other sums are most of a run's time, and the clients do the same either way).
EXTENDED = {
    "fedcorr": ("strategy=fedcorr strategy.t1=1 strategy.t2=2 strategy.stage3=feddyn", 19, 25),
    "feddiv": ("strategy=feddiv", 23, 32),
    "fedes": ("strategy=fedes strategy.s1=1 strategy.mu=arithmetic_mean", 16, 22),
}


def trained(grid: LocalGrid) -> int:
    return sum(message.metadata.message_type == "train" for message in grid.delivered)


@pytest.mark.parametrize("name", EXTENDED)
def test_a_run_extended_to_a_larger_budget_equals_the_run_at_that_budget(run_at, tmp_path, name):
    overrides, short, long = EXTENDED[name]
    source, short_grid = run_at(f"{overrides} comm_budget={short}", "short")
    reference, whole = run_at(f"{overrides} comm_budget={long}", "long")
    extended, grid = run_at(f"{overrides} comm_budget={long} extend_from={tmp_path / 'short'}", "extended")
    assert_same_run(extended, reference, tmp_path, ("extended", "long"))
    last = source["rounds"][-1]["round"]
    assert last < reference["rounds"][-1]["round"]
    assert trained(grid) == trained(whole) - trained(short_grid) > 0, "only the rounds after the shorter run's"
    assert extended["attempts"]["extended_from"] == {
        "run_dir": str(tmp_path / "short"), "round": last, "elapsed_s": source["rounds"][-1]["elapsed_s"]}
    if name != "fedcorr":
        return
    # Killed before its last message and resumed from its own checkpoint: the same run, without the
    # shorter run's folder (once: a resume does not depend on how the run began).
    again = f"{overrides} comm_budget={long} extend_from={tmp_path / 'short'}"
    assert run_at(again, "again", kill_at=len(grid.delivered) - 1)[0] is None
    assert max(CheckpointStore(tmp_path / "again").rounds()) > last
    shutil.rmtree(tmp_path / "short")
    resumed, _ = run_at(f"{again} resume=true", "again")
    assert_same_run(resumed, reference, tmp_path, ("again", "long"))


def test_extend_from_is_refused_in_one_line_unless_it_names_a_finished_shorter_run_of_the_config(run_at, tmp_path):
    run_at("strategy=fedavg comm_budget=6", "short")
    assert run_at("strategy=fedavg comm_budget=12", "killed", kill_at=15)[0] is None

    def refused(overrides: str, folder: str = "short") -> str:
        words = [*SMOKE.split(), *overrides.split(), f"extend_from={tmp_path / folder}", f"out_dir={tmp_path / 'x'}"]
        with pytest.raises(ConfigError) as err:
            load_run(compose_config(words))
        message = str(err.value)
        assert message.startswith("extend_from=") and "\n" not in message
        return message

    assert "null with strategy=fednoro: its comm_budget shapes its earlier rounds" in refused(
        "strategy=fednoro comm_budget=60")
    assert "comm_budget smaller than this run's (6); that run's is 6" in refused("strategy=fedavg comm_budget=6")
    assert "differing: seed (1 -> 2)" in refused("strategy=fedavg comm_budget=12 seed=2")
    assert "a finished run" in refused("strategy=fedavg comm_budget=12", "killed")
    assert "has no checkpoints/run.json" in refused("strategy=fedavg comm_budget=12", "nothing")
    assert not (tmp_path / "x").exists()


def test_a_killed_run_whose_folder_moved_resumes_there_to_the_uninterrupted_result(run_at, tmp_path):
    overrides = RUNS["feddyn"]  # its nodes' state is in the folder too
    reference, _ = run_at(overrides, "reference")
    assert run_at(overrides, "started", kill_at=18)[0] is None  # in round 3, after the checkpoint of round 2
    shutil.move(tmp_path / "started", tmp_path / "moved")
    resumed, _ = run_at(f"{overrides} resume=true", "moved")
    assert_same_run(resumed, reference, tmp_path, ("moved", "reference"))
    assert resumed["attempts"]["resumed_at"] == [2] and not (tmp_path / "started").exists()


def test_resume_refuses_a_changed_config_naming_the_keys(run_at, tmp_path):
    run_at(RUNS["fedavg"], "run", kill_at=15)
    # The killed run's folder reads back with the rounds it finished (report.py reads runs in progress).
    (killed,) = find_runs([str(tmp_path / "run")])
    assert killed.payload["complete"] is False and [row["round"] for row in killed.payload["rounds"]] == [1]

    def words(*changes: str) -> list[str]:
        return [*SMOKE.split(), *RUNS["fedavg"].split(), "resume=true", f"out_dir={tmp_path / 'run'}", *changes]

    with pytest.raises(ConfigError, match=r"resume=True is invalid: .* Differing: strategy.num_rounds \(4 -> 6\)"):
        load_run(compose_config(words("strategy.num_rounds=6")))
    # What only changes how the run executes may change.
    load_run(compose_config(words("server.round_timeout=30", "simulation.verbose=true")))


def test_a_resume_or_extension_is_refused_when_nodes_keep_their_state_in_memory_only(run_at, tmp_path):
    from server.run import check_nodes_keep_state, continuation
    from strategies.federation import Federation

    run_at(RUNS["fedavg"], "run", kill_at=20)  # after the checkpoint of round 2
    plan = load_run(compose_config([*SMOKE.split(), *RUNS["fedavg"].split(), "resume=true",
                                    f"out_dir={tmp_path / 'run'}"]))
    nodes = {pid: pid + 100 for pid in range(10)}
    strategy = plan.strategy.build(plan.context())
    strategy.bind(Federation(nodes, dict.fromkeys(nodes, 50), without_state=frozenset({3, 7})))
    with pytest.raises(ConfigError, match=r"resume=True is invalid: nodes that keep their state on disk; the "
                                          r"nodes of partitions \[3, 7\] have no state-dir"):
        check_nodes_keep_state(strategy, continuation(plan.settings, strategy, CheckpointStore(tmp_path / "run")))
    strategy.bind(Federation(nodes, dict.fromkeys(nodes, 50)))
    check_nodes_keep_state(strategy, continuation(plan.settings, strategy, CheckpointStore(tmp_path / "run")))
    # So is an extension: its nodes read the shorter run's state.
    run_at("strategy=fedavg comm_budget=20", "short")
    plan = load_run(compose_config([*SMOKE.split(), "strategy=fedavg", "comm_budget=40",
                                    f"extend_from={tmp_path / 'short'}", f"out_dir={tmp_path / 'long'}"]))
    strategy = plan.strategy.build(plan.context())
    strategy.bind(Federation(nodes, dict.fromkeys(nodes, 50), without_state=frozenset({5})))
    with pytest.raises(ConfigError, match=r"^extend_from='\S+/short' is invalid: nodes that keep their state on disk; "
                                          r"the nodes of partitions \[5\] have no state-dir"):
        check_nodes_keep_state(strategy, continuation(plan.settings, strategy, CheckpointStore(tmp_path / "long")))


def lose_state(folder: Path, partition: int, after: int = 0) -> None:
    """Remove one simulated node's state versions written after round ``after``, of every run under
    ``folder`` (0: all of them, an emptied state-dir)."""
    for version in (folder / "client_state").glob(f"run-*/partition-{partition}/*/r*.npz"):
        if int(version.name[1:8]) > after:
            version.unlink()


def test_a_continued_run_is_refused_before_any_work_when_a_node_lost_the_state_it_had(run_at, tmp_path):
    overrides = RUNS["feddyn"]  # 3 of 10 clients a round, each keeping its correction term
    assert run_at(overrides, "run", kill_at=23)[0] is None  # in round 5, after the checkpoint of round 4
    checkpoint = read_checkpoint(CheckpointStore(tmp_path / "run").at(4))
    rounds = checkpoint.results["rounds"]
    answered = checkpoint.log["answered"]
    assert answered == {pid: row["round"] for row in rounds for pid in row["clients"]}, "each client's last round"

    def refused(folder: str, words: str, key: str) -> str:
        with pytest.raises(ConfigError) as err:
            run_at(words, folder)
        message = str(err.value)
        assert message.startswith(f"{key} is invalid: nodes that hold their state as it was at the checkpoint; "
                                  "the nodes of partitions ") and "\n" not in message
        return message

    lost = min(answered)
    lose_state(tmp_path / "run", min(set(range(10)) - set(answered)))  # it had none: not refused for
    lose_state(tmp_path / "run", lost)
    assert f"partitions {lost} (answered in round {answered[lost]}, keeps state up to round 0) do not" in refused(
        "run", f"{overrides} resume=true", "resume=True")
    assert CheckpointStore(tmp_path / "run").rounds() == (2, 4), "nothing ran"
    # Older state than the checkpoint records is lost state too: a client of rounds 2 and 4 without round 4's.
    older = min(pid for pid in rounds[1]["clients"] if answered[pid] == 4 and pid not in rounds[2]["clients"])
    lose_state(tmp_path / "run", older, after=2)
    assert f"{older} (answered in round 4, keeps state up to round 2)" in refused(
        "run", f"{overrides} resume=true", "resume=True")
    # So is a node that lost one record and kept the rest: the correction term of the one round it trained
    # in gone, its answer whole (the answer lists the correction's version because it is recorded once the
    # round's work is done, not before the node's first version was written).
    trained = Counter(pid for row in rounds for pid in row["clients"])
    partial = min(pid for pid in answered if trained[pid] == 1 and pid not in (lost, older))
    for version in (tmp_path / "run" / "client_state").glob(f"run-*/partition-{partial}/feddyn-correction/*.npz"):
        version.unlink()
    assert list((tmp_path / "run" / "client_state").glob(f"run-*/partition-{partial}/answered/*.npz"))
    assert f"{partial} (answered in round {answered[partial]}, keeps state up to round 0)" in refused(
        "run", f"{overrides} resume=true", "resume=True")
    # So is a run that extends another whose nodes lost theirs.
    run_at("strategy=feddyn comm_budget=9", "short")
    short = read_checkpoint(CheckpointStore(tmp_path / "short").at(3)).log["answered"]
    lose_state(tmp_path / "short", max(short))
    extension = f"strategy=feddyn comm_budget=15 extend_from={tmp_path / 'short'}"
    assert f"partitions {max(short)} (answered in round {short[max(short)]}, keeps state up to round 0)" in refused(
        "long", extension, f"extend_from='{tmp_path / 'short'}'")
    # A strategy whose clients keep no state asks nothing: a node with an emptied state-dir computes the same.
    reference, _ = run_at(RUNS["fedavg"], "plain-reference")
    assert run_at(RUNS["fedavg"], "plain", kill_at=20)[0] is None
    for pid in range(10):
        lose_state(tmp_path / "plain", pid)
    resumed, grid = run_at(f"{RUNS['fedavg']} resume=true", "plain")
    assert_same_run(resumed, reference, tmp_path, ("plain", "plain-reference"))
    assert not any(message.metadata.message_type == HELD for message in grid.delivered)


def test_resume_true_without_a_checkpoint_starts_from_round_zero(run_at, tmp_path):
    reference, _ = run_at(RUNS["fedavg"], "reference")
    started, _ = run_at(f"{RUNS['fedavg']} resume=true", "fresh")
    assert_same_run(started, reference, tmp_path, ("fresh", "reference"))


# --- the strategy state interface -----------------------------------------------------------------

def same(a: Any, b: Any) -> bool:
    """Deep equality over what strategies hold: containers, NumPy, records, dataclasses, objects."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, ArrayRecord):
        return list(a) == list(b) and all(same(a[k].numpy(), b[k].numpy()) for k in a)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b or (np.isnan(a) and np.isnan(b))
    if isinstance(a, np.random.Generator):
        return a.bit_generator.state == b.bit_generator.state
    if is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if hasattr(a, "__dict__") and not callable(a):
        return same(vars(a), vars(b))
    return bool(a == b)


# Attributes a strategy sets afresh in every round (what the round's clients start from, whom it sent
# to), and the wiring that holds the shared generator and run log (checkpointed once, by the server).
PER_ROUND = {"global_arrays", "_sent", "_grid", "log", "rng", "timeout", "context"}


def builder(overrides: str, out_dir: Path):
    """``(build, grid, model)``: ``build()`` makes the run's strategy afresh, bound to the grid's nodes."""
    from client.app import app as client_app
    from data.scene import prepare_scene
    from strategies.ground_truth import GroundTruth

    words = [*overrides.split(), f"out_dir={out_dir}"]
    plan = load_run(compose_config(words))
    grid = LocalGrid(client_app, num_nodes=10, run_config={"overrides": " ".join(words)})
    scene, dataset, _ = prepare_scene(plan.settings.scene, plan.settings.out_dir)
    model = initial_model(plan.settings, dataset)

    def build():
        context = plan.context(parameter_names=tuple(n for n, _ in model.named_parameters()),
                               truth=GroundTruth.from_scene(scene),
                               new_network=lambda: ArrayRecord(model.state_dict()))
        strategy = plan.strategy.build(context)
        strategy.bind(discover(grid, 10, 5.0, 60.0))
        return strategy

    return build, grid, model


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_strategys_state_is_everything_that_changes_and_restores_whole(flower_identity, tmp_path, name):
    """What a checkpoint keeps of a strategy is ``state()``: everything but its ``transient`` wiring.
    After some rounds, a fresh strategy restored from that state equals the run's in every attribute,
    and no transient attribute changed during the run (so state kept there would be lost)."""
    build, grid, model = builder(f"{SMOKE} {RUNS[name]}", tmp_path / "run")
    strategy, fresh = build(), build()
    stop = 3

    def halt(server_round: int, arrays: ArrayRecord) -> None:
        if server_round == stop:
            raise Killed

    strategy.log.checkpoint = halt
    with pytest.raises(Killed):
        strategy.start(grid, ArrayRecord(model.state_dict()), timeout=60.0)
    saved = strategy.state()
    restored = build()
    restored.restore(pickle.loads(pickle.dumps(saved)))
    assert same(restored.state(), saved), f"{name} does not restore what it saves"
    changed = [key for key in saved if not same(saved[key], fresh.state()[key])]
    assert changed, f"{name} learnt nothing in {stop} rounds: the test would not bite"
    for key in set(vars(strategy)) - set(saved) - PER_ROUND:
        assert same(vars(strategy)[key], vars(fresh)[key]), f"{name}.{key} changed during the run but is not saved"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_strategy_that_extends_runs_differs_across_budgets_only_where_it_says(flower_identity, tmp_path, name):
    """Built for two budgets, a strategy differs only in its ``budget_sized`` attributes (FedCorr's
    stage 3 in its own), so a longer run may take over the rest from a shorter one (``extend_from``);
    one that says it cannot extend runs differs in more."""
    short, long = (builder(f"{SMOKE} {RUNS[name]} comm_budget={budget}", tmp_path / str(budget))[0]()
                   for budget in (60, 90))
    differing = {key for key, value in short.state().items() if not same(value, long.state()[key])}
    if "stage3" in differing:
        inner = short.stage3.state()
        differing |= {f"stage3.{key}" for key, value in inner.items() if not same(value, long.stage3.state()[key])}
        allowed = {"stage3", *(f"stage3.{key}" for key in short.stage3.budget_sized or ())}
    else:
        allowed = set()
    if short.budget_sized is None:
        assert differing - {"num_rounds"}, f"{name} says the budget shapes its early rounds; it sizes only num_rounds"
    else:
        assert differing, "the budget changed nothing: the test would not bite"
        assert differing <= short.budget_sized | allowed


def test_every_registered_strategy_is_covered():
    assert set(RUNS) == set(strategy_classes())


# --- the checkpoint store --------------------------------------------------------------------------

def checkpoint(server_round: int, size: int = 3) -> Checkpoint:
    return Checkpoint(round=server_round, arrays={"w": np.arange(size, dtype=np.float32)}, strategy={"x": server_round},
                      log={}, generators={}, results={}, lineage=Lineage("k"))


def test_the_store_keeps_the_latest_periodic_checkpoints_and_every_stage_end(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for server_round in range(1, 8):
        store.write(checkpoint(server_round), stage_end=server_round in (2, 3))
    assert store.rounds() == (2, 3, 6, 7)
    assert read_checkpoint(store.latest()).strategy == {"x": 7}
    assert read_checkpoint(store.at(2)).round == 2


def test_a_write_that_dies_half_way_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)
    store.write(checkpoint(4), stage_end=False)

    def dies(payload, out, protocol):
        out.write(pickle.dumps(payload, protocol)[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(pickle, "dump", dies)
    with pytest.raises(KeyboardInterrupt):
        store.write(checkpoint(6, size=10**6), stage_end=False)
    assert store.rounds() == (4,) and read_checkpoint(store.latest()).round == 4
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


# --- the nodes' state versions ---------------------------------------------------------------------

def node(tmp_path: Path) -> Context:
    return Context(run_id=1, node_id=5, node_config={"partition-id": 0, "state-dir": str(tmp_path)},
                   state=RecordDict(), run_config={})


def stored(context: Context, scope: StateScope, value: int | None = None) -> int | None:
    enter(context, with_scope(RecordDict(), scope), "unused")
    if value is not None:
        save_record(context, "key", 0, ArrayRecord({"v": Array(np.array([value]))}))
    record = load_record(context, "key", 0)
    return None if record is None else int(record["v"].numpy()[0])


def test_a_resume_ignores_and_removes_what_the_killed_attempt_wrote_after_its_checkpoint(tmp_path):
    context = node(tmp_path)
    for server_round in (1, 3, 5, 7):
        stored(context, StateScope("run", server_round, keep=(4,)), value=server_round)
    # Resumed from the checkpoint of round 4: the versions of rounds 5 and 7 were undone.
    assert stored(context, StateScope("run", 5, resumed_at=(4,), keep=(4,))) == 3
    assert stored(context, StateScope("run", 5, resumed_at=(4,), keep=(4,)), value=50) == 50
    folder = tmp_path / "run-run" / "partition-0" / "key"
    assert [(v.round, v.attempt) for v in versions(folder)] == [(3, 1), (5, 2)]
    # A second resume from round 4 again undoes attempt 2's round 5 too; attempt 1's round 3 stays.
    assert stored(context, StateScope("run", 5, resumed_at=(4, 4), keep=(4,))) == 3
    # Another run's key sees none of it; a run started from this one's round 4 reads its version.
    assert stored(context, StateScope("new", 5)) is None
    assert stored(context, StateScope("new", 5, parent="run", parent_round=4, parent_resumed_at=(4, 4))) == 3


def test_a_late_write_of_a_killed_attempt_leaves_the_resumed_runs_versions(tmp_path):
    context, late = node(tmp_path), node(tmp_path)
    stored(context, StateScope("run", 12, keep=(10,)), value=12)
    # Attempt 2 resumed from round 12 and wrote round 13; then a client of attempt 1 finishes round 14.
    stored(context, StateScope("run", 13, resumed_at=(12,), keep=(12,)), value=113)
    stored(late, StateScope("run", 14, keep=(12,)), value=14)
    assert stored(context, StateScope("run", 14, resumed_at=(12,), keep=(12,))) == 113


def test_a_node_keeps_one_version_per_kept_checkpoint_and_the_newest(tmp_path):
    context = node(tmp_path)
    for server_round in range(1, 11):
        stored(context, StateScope("run", server_round, keep=(4, 8)), value=server_round)
    assert [v.round for v in versions(tmp_path / "run-run" / "partition-0" / "key")] == [4, 8, 10]


def test_an_instruction_without_a_scope_keeps_state_in_memory(tmp_path):
    context = node(tmp_path)
    enter(context, RecordDict(), "unused")
    save_record(context, "key", 0, ArrayRecord({"v": Array(np.array([1]))}))
    assert not list(tmp_path.rglob("*.npz")) and "key" in context.state.array_records
    assert isinstance(with_scope(RecordDict(), StateScope("r", 1))["scope"], ConfigRecord)


# --- the results files ------------------------------------------------------------------------------

def test_a_resumed_writer_drops_the_rounds_after_its_checkpoint(tmp_path):
    writer = ResultsWriter(tmp_path, {"seed": 1})
    for server_round in (1, 2):
        writer.add_round(server_round=server_round, stage="s", clients=[1], comm_cost=server_round, test_acc=0.5,
                         test_loss=1.0)
    state = writer.state()
    writer.add_round(server_round=3, stage="s", clients=[1], comm_cost=3, test_acc=0.9, test_loss=1.0)
    with open(tmp_path / "rounds.jsonl", "a") as out:
        out.write('{"round": 4, "sta')  # a line cut short by the kill
    resumed = ResultsWriter(tmp_path, {"seed": 1}, state)
    assert [json.loads(line)["round"] for line in (tmp_path / "rounds.jsonl").read_text().splitlines()] == [1, 2]
    assert (tmp_path / "rounds.csv").read_text().count("\n") == 3
    assert resumed.elapsed >= state["elapsed_s"]
    assert "rounds" not in json.loads((tmp_path / "results.json").read_text())
