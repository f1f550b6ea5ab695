"""What leaves a client, checked against its one declaration (``protocol.reply_fields``): the table in
docs/design.md is the declaration's; every strategy's replies in the test grid carry exactly the
declared fields of each message kind; ground-truth diagnostics leave a node only where its node
config allows them, and the server's figures are then null with the reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict

from client import app as client_app
from client.node import DIAGNOSTICS_KEY, sends_ground_truth
from client.state_store import ANSWERED_KEY
from common.errors import InvalidValue
from common.run_files import CONFUSION
from protocol.fedcorr import CorrectIns, CorrectRes
from protocol.messages import EVALUATE, HELD, LOSS, StateScope, instruction, read_reply, with_scope
from protocol.reply_fields import EVERY, REPLY_FIELDS, TENSORS, markdown_table
from server.config import load_run
from settings.compose import compose_config
from strategies.detection import missing_diagnostics
from strategies.registry import strategy_classes

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
GROUND_TRUTH = {(f.message, f.record, f.key) for f in REPLY_FIELDS if f.ground_truth}

# One local epoch: which fields a reply carries does not depend on how long clients train.
SMOKE = "experiment=smoke strategy.train.epochs=1"
# One short in-process run per strategy (ground truth on, as in a simulation), and the keys (or whole
# message types) a run's settings leave out of what the strategy's clients may send.
RUNS: dict[str, tuple[str, set[str]]] = {
    "fedavg": ("strategy=fedavg strategy.num_rounds=2", set()),
    "fedprox": ("strategy=fedprox strategy.num_rounds=2", set()),
    "fedmedian": ("strategy=fedmedian strategy.num_rounds=2", set()),
    "fedlsr": ("strategy=fedlsr strategy.num_rounds=2", set()),
    "feddyn": ("strategy=feddyn strategy.num_rounds=2", set()),
    "rfa": ("strategy=rfa strategy.num_rounds=2", set()),
    "scaffold": ("strategy=scaffold strategy.num_rounds=2", set()),
    "poc": ("strategy=poc strategy.num_rounds=2", set()),
    # The server's summary of the weights (mu) does not change what clients send: the plain mean
    # spares eleven GMM fits.
    "fedes": ("strategy=fedes strategy.num_rounds=3 strategy.s1=1 strategy.mu=arithmetic_mean", set()),
    # The static mask: its clients keep their CoP from the estimation round (node state).
    "fedes-static": ("strategy=fedes strategy.num_rounds=3 strategy.s1=1 strategy.mu=arithmetic_mean "
                     "strategy.mask=static", set()),
    "fednoro": ("strategy=fednoro strategy.num_rounds=6", {"counts"}),
    "fednoro-counts": ("strategy=fednoro strategy.num_rounds=6 strategy.detect_counts=true", {"present"}),
    "feddiv": ("strategy=feddiv strategy.num_rounds=2", set()),
    "fedcorr": ("strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=1", {"loss-share", LOSS}),
    "fedcorr-share": ("strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=1 strategy.client_score=loss_share",
                      {LOSS}),
    "fedcorr-disagreement": ("strategy=fedcorr strategy.t1=1 strategy.t2=1 strategy.t3=1 "
                             "strategy.client_score=disagreement", {"loss-share"}),
}
Sent = set[tuple[str, str, str]]
# Message kinds no run above asks for, answered by the test that checks the table has no stale row.
ANSWERED_HERE = (EVALUATE, HELD)


def sent_fields(content: RecordDict, message_type: str) -> Sent:
    """(message type, record, key) of every field of a reply (an arrays record as ``TENSORS``)."""
    fields: Sent = set()
    for record, values in content.items():
        keys = [TENSORS] if isinstance(values, ArrayRecord) else list(values)
        fields |= {(message_type, record, key) for key in keys}
    return fields


def recording(sent: Sent, exchanges: list[tuple[Message, Message]] | None = None,
              ) -> Callable[[Message, Context], Message]:
    """The project's ClientApp, noting every field of every reply it gives (and, with ``exchanges``,
    each message with its reply)."""
    def handle(message: Message, context: Context) -> Message:
        reply = client_app.app(message, context)
        if not reply.has_error():
            sent.update(sent_fields(reply.content, message.metadata.message_type))
            if exchanges is not None:
                exchanges.append((message, reply))
        return reply

    return handle


def declared(strategy: str) -> Sent:
    """The fields the declaration says the clients of ``strategy`` send."""
    return {(f.message, f.record, f.key) for f in REPLY_FIELDS if EVERY in f.senders or strategy in f.senders}


def by_kind(fields: Sent) -> dict[tuple[str, str], set[str]]:
    kinds: dict[tuple[str, str], set[str]] = {}
    for message, record, key in fields:
        kinds.setdefault((message, record), set()).add(key)
    return kinds


def test_the_design_page_shows_the_declared_table():
    assert markdown_table() in DESIGN.read_text(), "regenerate it: python -m protocol.reply_fields"
    assert markdown_table().count("\n") > 20 and "| yes |" in markdown_table()


def test_every_strategy_has_a_run_here():
    assert {run.split("-")[0] for run in RUNS} == set(strategy_classes())


@pytest.mark.parametrize("run", sorted(RUNS))
def test_each_strategys_replies_carry_exactly_the_declared_fields(run_inprocess, tmp_path, run):
    overrides, left_out = RUNS[run]
    strategy = run.split("-")[0]
    sent: Sent = set()
    exchanges: list[tuple[Message, Message]] = []
    payload, _ = run_inprocess(f"{SMOKE} {overrides}", client_app=recording(sent, exchanges))
    expected = {field for field in declared(strategy)
                if field[2] not in left_out and field[0] not in left_out and field[0] not in ANSWERED_HERE}
    assert by_kind(sent) == by_kind(expected)
    # And what stays on the client: the records its nodes kept besides the rounds they answered in are
    # what the strategy's node_state declares (a resume checks nodes still hold them: server.held).
    kept = {path.name for path in (tmp_path / "run" / "client_state").glob("run-*/partition-*/*")}
    plan = load_run(compose_config([*f"{SMOKE} {overrides}".split(), f"out_dir={tmp_path / 'plan'}"]))
    assert ANSWERED_KEY in kept
    built = plan.strategy.build(plan.context(parameter_names=("w",)))
    assert bool(kept - {ANSWERED_KEY}) is built.node_state(), sorted(kept)
    if strategy == "fedcorr":  # results.json counts the score's queries (T1 = 1: one per client), apart from comm_cost
        queries = sum(message.metadata.message_type == LOSS for message, _ in exchanges)
        assert payload["fedcorr"]["disagreement_queries"] == queries == (10 if run == "fedcorr-disagreement" else 0)


def test_every_declared_field_is_sent_by_some_run_or_answered_here(incoming, node_context, prepared_run):
    """No stale row: the ``evaluate`` reply (which no strategy asks for) and the ``query.held`` reply (asked
    only when a run continues a checkpoint: tests/test_resume.py) carry what the table says, and the runs
    above together send every other declared field."""
    overrides, _, arrays = prepared_run("experiment=smoke")
    context = node_context(overrides, 0)
    replies = {EVALUATE: client_app.evaluate(incoming(instruction(arrays=arrays), EVALUATE), context),
               HELD: client_app.held(incoming(with_scope(instruction(), StateScope("run", 3, (3,))), HELD), context)}
    for kind, reply in replies.items():
        assert sent_fields(reply.content, kind) == {(f.message, f.record, f.key) for f in REPLY_FIELDS
                                                    if f.message == kind}
    senders = {name for f in REPLY_FIELDS for name in f.senders} - {EVERY}
    assert senders <= set(strategy_classes()), "a row names a strategy that does not exist"
    for f in REPLY_FIELDS:
        if f.message not in ANSWERED_HERE:
            covering = [run for run, (_, left_out) in RUNS.items()
                        if f.key not in left_out and (EVERY in f.senders or run.split("-")[0] in f.senders)]
            assert covering, f"no run sends {f}"


# --- ground-truth diagnostics: the node decides ---------------------------------------------------

def context_with(overrides: str, partition_id: int, **node_config) -> Context:
    config = {"partition-id": partition_id, "num-partitions": 10, **node_config}
    return Context(run_id=1, node_id=77, node_config={k: v for k, v in config.items() if v is not None},
                   state=RecordDict(), run_config={"overrides": overrides})


@pytest.mark.parametrize("node_config, sends", [
    ({}, True),                                                    # a virtual node of the simulation
    ({"num-partitions": None}, False),                             # deployed: partition-id only
    ({"num-partitions": None, DIAGNOSTICS_KEY: True}, True),       # deployed, its operator allows them
    ({DIAGNOSTICS_KEY: False}, False),                             # simulated, but refused by its config
    ({"data-path": "/data/client_3.npz"}, False),                  # its own data file
])
def test_the_node_config_decides_whether_ground_truth_counts_may_leave(node_config, sends):
    assert sends_ground_truth(context_with("experiment=smoke", 3, **node_config)) is sends


def test_a_bad_flag_value_is_one_line_naming_the_key_and_fails_the_nodes_first_reply(prepared_run, incoming):
    overrides, _, _ = prepared_run("experiment=smoke")
    message = r"^node_config.ground-truth-diagnostics='yes' is invalid: allowed is true or false$"
    with pytest.raises(InvalidValue, match=message):
        sends_ground_truth(context_with(overrides, 3, **{DIAGNOSTICS_KEY: "yes"}))
    with pytest.raises(InvalidValue, match=message):
        client_app.info(incoming(instruction(), "query.info"), context_with(overrides, 3, **{DIAGNOSTICS_KEY: "yes"}))
    assert client_app.info(incoming(instruction(), "query.info"), context_with(overrides, 3)).content["metrics"]


def test_a_deployed_node_answers_a_correction_without_ground_truth_fields(prepared_run, incoming):
    overrides, _, arrays = prepared_run("experiment=smoke strategy=fedcorr")
    ins = CorrectIns(mode="stage2", pi=0.5, theta=0.5, split_losses="local", rank_losses="global",
                     diagnostics=True)

    def fields(**node_config) -> set[str]:
        message = incoming(instruction(ins, arrays=arrays), "query.correct")
        content = client_app.app(message, context_with(overrides, 2, **node_config)).content
        assert read_reply(content, CorrectRes, "client 2").n_relabeled >= 0
        return {key for _, _, key in sent_fields(content, "query.correct")}

    truth = {key for message, _, key in GROUND_TRUTH if message == "query.correct"}
    assert fields() & truth == truth - {"split-tp", "split-fp", "split-fn", "split-tn"}
    assert fields(**{"num-partitions": None}) == {"n-relabeled"}
    assert fields(**{"num-partitions": None, DIAGNOSTICS_KEY: True}) == fields()


DEPLOYED = {pid: {"num-partitions": None} for pid in range(10)}


@pytest.mark.parametrize("run", ["fedcorr", "feddiv"])
def test_deployed_nodes_send_no_ground_truth_and_the_figures_are_null_with_the_reason(run_inprocess, run):
    overrides, _ = RUNS[run]
    sent: Sent = set()
    payload, grid = run_inprocess(f"{SMOKE} {overrides}", client_app=recording(sent),
                                  node_configs=DEPLOYED)
    assert sent and not sent & GROUND_TRUTH
    block = json.loads(json.dumps(payload[run]))
    reason = block["label_noise_not_available"]
    assert reason and "ground-truth-diagnostics=true" in reason
    assert block["label_noise_not_available"] == missing_diagnostics(_reported(block, run))
    # Detection needs only the server's own truth: it is still scored.
    assert block["detection"] is not None and block["detection_not_applicable"] is None
    if run == "fedcorr":
        assert block["label_noise"]["before"] is not None
        assert block["label_noise"]["after_stage1"] is None and block["label_noise"]["after_stage2"] is None
        assert block["relabel_precision"] is None and block["relabeled"] is None
        assert block["relabel_by_step"] is None and block["noise_estimate_mae"] is None
        assert block["noise_estimate_mae_original"] is not None
        assert block["confusion"] is None and not (Path(payload["config"]["out_dir"]) / CONFUSION).exists()
        flagged = [row for row in block["clients"] if row["detected_noisy"]]
        assert flagged and all(row["true_noise_after"] is None for row in flagged)
    else:
        assert block["label_noise"] is None and block["sample_split"] is None and block["per_class"] is None
        assert block["noise_estimate_mae"] is not None


def _reported(block: dict, run: str) -> list[int]:
    """The clients that answered a request for ground-truth counts: FedCorr's corrected clients (the
    ones flagged in its one stage-1 iteration, and those outside S_c at the end of stage 2), FedDiv's
    main-phase clients."""
    if run == "feddiv":
        return sorted(int(pid) for pid in block["noise_estimates"])
    return sorted(row["client"] for row in block["clients"] if row["detected_noisy"] or not row["finetuned"])


def test_the_confusion_file_holds_the_counts_the_clients_sent(run_inprocess):
    """confusion.npz holds what results.json's ``fedcorr.confusion`` held: per corrected client, the
    counts before its first correction and after its latest correction of each stage."""
    from common.atomic_files import read_npz
    from common.run_files import read_confusion
    from reports.runs import find_runs

    sent: Sent = set()
    exchanges: list[tuple[Message, Message]] = []
    payload, grid = run_inprocess(f"{SMOKE} {RUNS['fedcorr'][0]}", client_app=recording(sent, exchanges))
    expected: dict[str, dict[str, list[int]]] = {}
    for message, reply in exchanges:
        if message.metadata.message_type != "query.correct":
            continue
        pid = int(grid.contexts[message.metadata.dst_node_id].node_config["partition-id"])
        mode, counts = message.content["config"]["mode"], reply.content["metrics"]
        matrices = expected.setdefault(str(pid), {"before": list(counts["confusion-before"])})
        matrices[f"after_{mode}"] = list(counts["confusion-after"])
    assert expected and any("after_stage1" in m for m in expected.values())
    out = Path(payload["config"]["out_dir"])
    assert read_confusion(out) == expected
    block = payload["fedcorr"]
    assert block["label_noise_not_available"] is None and block["label_noise"]["after_stage2"] is not None
    assert block["confusion"] == {"file": CONFUSION, "clients": len(expected)}
    assert len(json.dumps(block)) < 20_000, "results.json keeps summaries; the counts are in the array file"
    # The stacked arrays: a client not corrected at a point carries its earlier counts.
    arrays = read_npz(out / CONFUSION)
    assert arrays["before"].shape == (len(expected), 10, 10) and arrays["before"].dtype == np.int64
    for row, pid in enumerate(arrays["clients"]):
        if not arrays["reported_after_stage1"][row]:
            assert np.array_equal(arrays["after_stage1"][row], arrays["before"][row])
    (run,) = find_runs([str(out)])
    assert run.confusion == expected
