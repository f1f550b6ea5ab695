"""FedDiv's client round on a six-sample node with hand-set logits: the objective each phase builds, the
consistency sampler's choice of local model per epoch and mode, and what a round passes on (its random
streams, the split at a posterior of exactly 1/2, the local EM from the global filter, the moved prior,
the trained rows' diagnostics, the error naming the server)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict
from test_feddiv import TRAINING, ConstantLogits, client_settings, one_em_step

import client.plugins.feddiv as plugin
from client.label_state import store_labels
from client.node import LocalNode
from client.plugins.feddiv import ClientState, ConsistencySampler, FedDivHooks, FedDivPlugin, Selection, load_state
from data.client_data import ClientData
from data.transforms import BatchTransform, TransformSpec
from protocol.codec import ProtocolError
from protocol.feddiv import FedDivClientSettings, FedDivIns
from protocol.messages import TrainIns, TrainStats, instruction
from task.learner_settings import LearnerSchedule
from task.noise_filter import NoiseFilter, min_max

LABELS = np.array([0, 1, 2, 0, 1, 2])
TRUTH = np.array([0, 1, 0, 0, 1, 1])  # rows 2 and 5 carry wrong labels
GLOBAL_FILTER = NoiseFilter(0.2, 0.8, 0.04, 0.01, 0.7, 0.3)
# A round's learner schedule as the server sends it; FedDiv's hooks keep it as every method's hooks do.
SCHEDULE = LearnerSchedule(distill_weight=0.5, forget_rate=0.25)


def confident(rows: list[int], value: float = 4.0) -> torch.Tensor:
    """Logits with ``value`` on class ``rows[i]`` of row i and 0 elsewhere (3 classes)."""
    logits = torch.zeros(len(rows), 3)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = value
    return logits


@dataclass(frozen=True)
class TinyNode(LocalNode):
    """A node whose model is ``ConstantLogits`` (its state: the logits of every row)."""

    def model_for_state(self, state_keys: Any) -> torch.nn.Module:
        return ConstantLogits(torch.zeros(len(self.data.labels), 3))


def tiny_node(partition_id: int = 3, rows: int = 6) -> TinyNode:
    """The first ``rows`` samples of LABELS/TRUTH on a node whose run seed is 11."""
    images = torch.zeros(rows, 1, 2, 2, dtype=torch.uint8).numpy()
    data = ClientData(images, LABELS[:rows].copy(), TRUTH[:rows].copy(), np.arange(rows))
    return TinyNode(partition_id, SimpleNamespace(seed=11), SimpleNamespace(num_classes=3), data,
                    BatchTransform(TransformSpec(), [0.5], [0.5], train=True),
                    BatchTransform(TransformSpec(), [0.5], [0.5], train=False), torch.device("cpu"))


def node_context(partition_id: int = 3, truth: bool = False) -> Context:
    """A node's context; ``truth``: the node allows ground-truth diagnostics."""
    config = {"partition-id": partition_id, "ground-truth-diagnostics": truth}
    return Context(run_id=1, node_id=77, node_config=config, state=RecordDict(), run_config={})


def content(ins: FedDivIns, server_round: int, global_logits: torch.Tensor, arrays: bool = True) -> RecordDict:
    record = ArrayRecord({"logits": Array(global_logits.numpy())}) if arrays else None
    return instruction(TrainIns(server_round, TRAINING, plugin="feddiv"), arrays=record, plugin_ins=ins,
                       plugin="feddiv")


class Spy:
    """Stands in for ``local_update``: records its arguments, asks the hooks for epoch 0's rows (as the
    loop does) and returns a model with the given logits."""

    def __init__(self, trained_logits: torch.Tensor) -> None:
        self.trained_logits = trained_logits
        self.calls: list[dict] = []

    def __call__(self, node: LocalNode, state: dict[str, torch.Tensor], hooks: FedDivHooks, server_round: int,
                 labels: np.ndarray | None = None) -> tuple[torch.nn.Module, TrainStats]:
        start = ConstantLogits(state["logits"])
        rows = hooks.epoch_rows(0, start)
        self.calls.append({"round": server_round, "labels": labels, "rows": rows, "hooks": hooks})
        return ConstantLogits(self.trained_logits), TrainStats(len(node.data.labels), 0.1, 1)


def run_round(monkeypatch: pytest.MonkeyPatch, params: FedDivClientSettings, global_logits: torch.Tensor,
              trained_logits: torch.Tensor, *, phase: str = "main", server_round: int = 7,
              filter: NoiseFilter | None = GLOBAL_FILTER, node: TinyNode | None = None,
              context: Context | None = None, diagnostics: bool = False) -> tuple[Any, Spy]:
    node = tiny_node() if node is None else node
    context = node_context(node.partition_id) if context is None else context
    spy = Spy(trained_logits)
    monkeypatch.setattr(plugin, "local_update", spy)
    ins = FedDivIns(phase=phase, params=params, eta=0.5, filter=filter, seed=2, diagnostics=diagnostics)
    trained = FedDivPlugin().train(node, context, TrainIns(server_round, TRAINING, plugin="feddiv", schedule=SCHEDULE),
                                   content(ins, server_round, global_logits))
    return trained, spy


# The objective each phase builds.

@pytest.mark.parametrize(("phase", "warmup_loss", "alpha"), [
    ("warmup", "ce", 0.0), ("warmup", "mixup", 0.4), ("main", "ce", 0.4), ("main", "mixup", 0.4)])
def test_only_a_ce_warmup_turns_mixing_off_and_eta_and_the_extra_pass_reach_the_learner(
        phase: str, warmup_loss: str, alpha: float) -> None:
    """The mixing alpha is 0 (plain cross-entropy) only in a warm-up with ``warmup_loss=ce``; the main phase always
    mixes with mixup_alpha; eta and ``bn_extra_pass`` are the instruction's."""
    params = client_settings(warmup_loss=warmup_loss, mixup_alpha=0.4, bn_extra_pass=True)
    hooks = FedDivHooks(TRAINING, None, FedDivIns(phase=phase, params=params, eta=0.3))
    learner = hooks.learner(torch.nn.Linear(2, 2), torch.Generator())
    assert (learner.alpha, learner.eta, learner.extra_forward) == (alpha, 0.3, True)


# The consistency sampler. Four candidates; the global model predicts 0 0 1 1, the model being trained
# 0 1 1 0, the labels cached from the last participation 1 0 1 1: agreement with the global model keeps
# all four, rows 0 and 2, or rows 1 2 3 respectively.
GLOBAL = confident([0, 0, 1, 1])
MODEL = ConstantLogits(confident([0, 1, 1, 0]))
CACHED = np.array([1, 0, 1, 1])


def sampler(pcs_mode: str, cached: np.ndarray | None) -> ConsistencySampler:
    selection = Selection(LABELS[:4].copy(), np.zeros(4, dtype=bool), np.arange(4), sampler=True)
    kept = ClientState(np.full(3, 1.0 / 3), participations=3, debiased=cached)
    return ConsistencySampler(selection, client_settings(pcs_mode=pcs_mode, xi=0.5), kept, GLOBAL,
                              np.array([0, 0, 1, 1]), tiny_node(rows=4))


@pytest.mark.parametrize(("pcs_mode", "cached", "epoch", "rows"), [
    ("epoch", None, 0, [0, 1, 2, 3]),  # epoch 0: the local model is still the global one
    ("epoch", None, 1, [0, 2]),  # later epochs: the model being trained
    ("cached", None, 1, [0, 1, 2, 3]),  # cached without earlier labels: the global model's
    ("cached", CACHED, 1, [1, 2, 3]),  # cached: the labels kept from the last participation
    ("cached", CACHED, 0, [1, 2, 3]),
])
def test_each_epoch_keeps_the_candidates_where_the_chosen_local_labels_agree(
        pcs_mode: str, cached: np.ndarray | None, epoch: int, rows: list[int]) -> None:
    """The hooks' rows come from the sampler, and its local labels from the global logits at epoch 0,
    the trained model afterwards, or (cached) the kept labels; ``trained`` follows the last epoch."""
    chosen = sampler(pcs_mode, cached)
    hooks = FedDivHooks(TRAINING, None, FedDivIns(phase="main", params=chosen.params, eta=0.0), chosen)
    got = hooks.epoch_rows(epoch, MODEL)
    np.testing.assert_array_equal(got.numpy(), rows)
    np.testing.assert_array_equal(chosen.trained, rows)


def test_before_any_epoch_the_sampler_reports_every_candidate() -> None:
    """``trained`` (the report's count) is the candidates until an epoch chose rows."""
    np.testing.assert_array_equal(sampler("epoch", None).trained, [0, 1, 2, 3])


# Whole client rounds, with local training replaced by ``Spy``.

def test_the_warmup_trains_on_the_current_labels_with_the_rounds_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm-up round trains on the node's labels after corrections (here stored ones), draws from
    this round's random stream (local_update's round) and its hooks carry the round's schedule."""
    node, context = tiny_node(), node_context()
    corrected = np.array([2, 2, 1, 1, 0, 0])
    store_labels(context, node, corrected)
    _, spy = run_round(monkeypatch, client_settings(), confident(list(LABELS)),
                       torch.zeros(6, 3), phase="warmup", node=node, context=context)
    (call,) = spy.calls
    assert call["round"] == 7 and call["rows"] is None and call["hooks"].schedule == SCHEDULE
    np.testing.assert_array_equal(call["labels"], corrected)


def test_a_main_round_scores_splits_trains_the_consistent_rows_and_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """filter_transform=train, em_iters=1, no relabelling. The global model predicts every given label
    with logit 4 except rows 2 and 5 (the true labels): their normalised losses are 1, the others 0, so
    the global filter flags them. The client trains on rows 0 1 3 4 with round 7's stream; the local
    filter is one EM step from the global filter; the prior moves with momentum 0.3 toward the mean
    prediction of the rows above confidence 0.9; the diagnostics count the trained rows only."""
    global_logits = confident([0, 1, 0, 0, 1, 1])
    local_augmented = confident([0, 1, 2, 0, 2, 2], value=2.0) + torch.tensor([[0.0, 1.0, 0.0]] * 6)
    trained_logits = torch.zeros(6, 3)
    trained_logits[:2, 0] = math.log(38.0)  # softmax (0.95, 0.025, 0.025); the other rows uniform
    node = tiny_node()
    seeds = []

    def augmented(model: torch.nn.Module, images: Any, transform: Any, generator: torch.Generator,
                  device: Any) -> torch.Tensor:
        seeds.append(generator.initial_seed())
        return global_logits if len(seeds) == 1 else local_augmented

    monkeypatch.setattr(plugin, "augmented_logits", augmented)
    params = client_settings(filter_transform="train", em_iters=1, relabel=False, momentum=0.3, xi=0.5,
                             prior_confidence=0.9)
    context = node_context(truth=True)
    trained, spy = run_round(monkeypatch, params, global_logits, trained_logits, node=node, context=context,
                             diagnostics=True)
    # The filter's scores draw from the node's streams named for this round and purpose.
    streams = [node.generator(7, f"feddiv-{purpose}").initial_seed() for purpose in ("global", "local")]
    assert seeds == streams
    (call,) = spy.calls
    assert call["round"] == 7 and call["hooks"].schedule == SCHEDULE
    np.testing.assert_array_equal(call["rows"].numpy(), [0, 1, 3, 4])
    report = trained.extra
    assert report.noise_estimate == pytest.approx(2 / 6) and (report.relabeled, report.trained) == (0, 4)
    ce = torch.nn.functional.cross_entropy(local_augmented, torch.from_numpy(LABELS), reduction="none").numpy()
    expected = one_em_step(min_max(ce.astype(np.float64)), [0.2, 0.8], [0.04, 0.01], [0.7, 0.3])
    assert asdict(report.filter) == pytest.approx(asdict(expected), rel=1e-5)
    state = load_state(context, node)
    np.testing.assert_allclose(state.prior, 0.3 / 3 + 0.7 * np.array([0.95, 0.025, 0.025]), rtol=1e-6)
    assert state.participations == 1
    # Rows 0 1 3 4 are trained, true classes 0 1 0 1, none mislabelled.
    assert report.diagnostics.class_trained == (2, 2, 0) and report.diagnostics.trained_wrong == 0


def test_a_posterior_of_exactly_one_half_counts_as_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """Normalised losses 0 0.5 1 0 0 1 under a filter with components at 0 and 1 (equal weights and
    variances): the middle row's clean posterior is exactly 1/2, and >= 0.5 keeps it clean."""
    monkeypatch.setattr(plugin, "per_sample_losses", lambda logits, labels: np.array([0.0, 1.0, 2.0, 0.0, 0.0, 2.0]))
    narrow = NoiseFilter(0.0, 1.0, 1e-4, 1e-4, 0.5, 0.5)
    trained, _ = run_round(monkeypatch, client_settings(), confident(list(LABELS)), torch.zeros(6, 3),
                           filter=narrow)
    assert trained.extra.noise_estimate == pytest.approx(2 / 6)


def test_a_balanced_split_gives_every_label_the_clients_clean_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """The losses of the test above flag both of label 2's rows noisy (4 clean of 6). With
    ``balanced_split`` each label keeps 4/6 of its two rows, the largest remainder going to label 0: label
    0 keeps both, label 1 its smaller loss (row 4), label 2 one of its two (row 2, the first of equal losses)."""
    monkeypatch.setattr(plugin, "per_sample_losses", lambda logits, labels: np.array([0.0, 1.0, 2.0, 0.0, 0.0, 2.0]))
    narrow = NoiseFilter(0.0, 1.0, 1e-4, 1e-4, 0.5, 0.5)
    rows = {}
    for balanced in (False, True):
        params = client_settings(relabel=False, pcs=False, balanced_split=balanced)
        trained, spy = run_round(monkeypatch, params, confident(list(LABELS)), torch.zeros(6, 3), filter=narrow)
        rows[balanced] = spy.calls[0]["rows"].numpy().tolist()
        assert trained.extra.noise_estimate == pytest.approx(2 / 6)
    assert rows == {False: [0, 1, 3, 4], True: [0, 2, 3, 4]}


def test_without_a_global_filter_the_bootstrap_mixture_seed_names_the_client_and_the_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in local mixture of a round without a global filter is seeded per client and round:
    client 3 and 4 in round 7 and client 3 in round 8 draw three different seeds."""
    real = plugin.fit_filter
    seeds = []

    def recording(losses: np.ndarray, seed: int, start: NoiseFilter | None = None,
                  max_iterations: int | None = None) -> NoiseFilter:
        if start is None:
            seeds.append(seed)
        return real(losses, seed, start=start, max_iterations=max_iterations)

    monkeypatch.setattr(plugin, "fit_filter", recording)
    global_logits = confident([0, 1, 0, 0, 1, 1])
    for pid, server_round in ((3, 7), (4, 7), (3, 8)):
        run_round(monkeypatch, client_settings(filter_init="local_bootstrap"), global_logits, torch.zeros(6, 3),
                  server_round=server_round, filter=None, node=tiny_node(pid))
    assert len(seeds) == 3 and len(set(seeds)) == 3


def test_a_train_instruction_without_arrays_is_an_error_naming_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol error a user reads says who sent the faulty instruction."""
    ins = FedDivIns(phase="main", params=client_settings(), eta=0.5, filter=GLOBAL_FILTER)
    with pytest.raises(ProtocolError, match="the server"):
        FedDivPlugin().train(tiny_node(), node_context(), TrainIns(7, TRAINING, plugin="feddiv"),
                             content(ins, 7, torch.zeros(6, 3), arrays=False))
