"""FedDyn's client plug-in on a hand-checkable node: the local objective L_k(w) - <g_k, w> + alpha/2
||w - w_global||^2 written out and minimised step by step, the new g_k = g_k - alpha (w_k - w_global)
kept per node (in memory, or on the node's disk with a state folder) and read back next round."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from defaults import local_training, lsr_settings
from flwr.app import ArrayRecord, Context, RecordDict
from pixels import IMAGES, LABELS, PIXELS, RAW, pixel_model
from torch import nn

from client.label_state import store_labels
from client.node import LocalNode
from client.plugins.feddyn import STATE_KEY, FedDynPlugin, LinearTerm
from client.state_store import enter, load_parameter_arrays, save_parameter_arrays
from client.update import local_update
from data.client_data import ClientData
from data.transforms import BatchTransform, TransformSpec
from protocol.codec import ProtocolError
from protocol.feddyn import FedDynIns
from protocol.messages import StateScope, TrainIns, instruction, with_scope
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining

ALPHA = 0.5
LR = 0.1
CORRECTED = np.array([1, 1, 0, 1])  # labels as a FedCorr correction leaves them: training must use these
# The sent prox settings are not FedDyn's: the plug-in must replace them by alpha/2 and the squared norm.
TRAINING = local_training(lr=LR, momentum=0.0, epochs=1, batch_size=2, prox_weight=0.3, prox_norm="l2")


class PixelNode(LocalNode):
    """A node whose model is ``pixels.pixel_model`` (logits = the two raw pixels) and whose data are
    the four pixel images; its random stream per round is LocalNode's own."""

    def new_model(self) -> nn.Module:
        return pixel_model()

    def model_for_state(self, state_keys: Any) -> nn.Module:
        return pixel_model()


def pixel_node(partition_id: int = 2) -> PixelNode:
    transform = BatchTransform(TransformSpec(), *RAW, train=True)
    data = ClientData(IMAGES.copy(), LABELS.copy(), LABELS.copy(), np.arange(4))
    return PixelNode(partition_id, cast(Any, SimpleNamespace(seed=5)), cast(Any, None), data, transform, transform,
                     torch.device("cpu"))


def start_state() -> dict[str, torch.Tensor]:
    """The global model: a pixel model moved off the identity so no logit is special."""
    return {"1.weight": torch.tensor([[1.0, 0.2], [-0.1, 0.8]]), "1.bias": torch.tensor([0.05, -0.05])}


def some_correction() -> dict[str, torch.Tensor]:
    """A previous g_k with a different value in every entry."""
    return {"1.weight": torch.tensor([[0.25, -0.5], [1.0, 0.75]]), "1.bias": torch.tensor([-0.3, 0.4])}


def feddyn_train(server_round: int, start: dict[str, torch.Tensor], training: LocalTraining = TRAINING,
                 schedule: LearnerSchedule | None = None) -> tuple[TrainIns, RecordDict]:
    """A FedDyn train instruction (alpha 0.5) from ``start``, and its message content."""
    ins = TrainIns(server_round, training, plugin="feddyn", schedule=schedule or LearnerSchedule())
    content = instruction(ins, arrays=ArrayRecord(dict(start)),
                          plugin_ins=FedDynIns(alpha=ALPHA), plugin="feddyn")
    return ins, content


def by_hand(node: LocalNode, server_round: int, start: dict[str, torch.Tensor], g: dict[str, torch.Tensor],
            labels: np.ndarray) -> dict[str, torch.Tensor]:
    """Plain SGD steps (lr 0.1, batches of 2 in the order of the node's first permutation for the round)
    on FedDyn's objective written out: CE(W x + b, y) - <g, w> + alpha/2 ||w - w_global||^2."""
    x, y = torch.from_numpy(PIXELS).float(), torch.from_numpy(labels)
    order = torch.randperm(4, generator=node.generator(server_round))
    w = {name: value.clone().requires_grad_(True) for name, value in start.items()}
    for rows in order.split(2):
        logits = x[rows] @ w["1.weight"].T + w["1.bias"]
        linear = sum(torch.sum(g[name] * w[name]) for name in w)
        quadratic = sum(torch.sum((w[name] - start[name]) ** 2) for name in w)
        objective = F.cross_entropy(logits, y[rows]) - linear + ALPHA / 2 * quadratic
        grads = torch.autograd.grad(objective, list(w.values()))
        w = {name: (w[name] - LR * grad).detach().requires_grad_(True) for name, grad in zip(w, grads)}
    return {name: value.detach() for name, value in w.items()}


def assert_parameters(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    trained = {name: p.detach() for name, p in model.named_parameters()}
    assert list(trained) == list(expected)
    for name in expected:
        torch.testing.assert_close(trained[name], expected[name])


def new_correction(g: dict[str, torch.Tensor], trained: dict[str, torch.Tensor],
                   start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """g_k - alpha (w_k - w_global)."""
    return {name: g[name] - ALPHA * (trained[name] - start[name]) for name in g}


def test_the_local_objective_has_the_linear_and_squared_quadratic_terms_and_the_new_g_is_kept() -> None:
    """With a kept g_k and corrected labels, the plug-in takes the SGD steps of FedDyn's objective
    (whatever prox settings the instruction carried: FedDyn's are alpha/2 and the squared norm) on the
    round's batch order, and keeps g_k - alpha (w_k - w_global) for the client's next round."""
    node, start, g = pixel_node(), start_state(), some_correction()
    context = Context(run_id=1, node_id=77, node_config={}, state=RecordDict(), run_config={})
    save_parameter_arrays(context, STATE_KEY, 2, g)
    store_labels(context, node, CORRECTED)
    ins, content = feddyn_train(3, start)
    model = FedDynPlugin().train(node, context, ins, content).model
    expected = by_hand(node, 3, start, g, CORRECTED)
    # The quadratic term acts from the second step on; it moves every entry by 3.7e-3 or more here.
    assert_parameters(model, expected)
    kept = load_parameter_arrays(context, STATE_KEY, 2, start)
    for name, value in new_correction(g, expected, start).items():
        torch.testing.assert_close(kept[name], value)


def test_the_correction_is_kept_on_the_nodes_disk_per_partition_and_read_back_next_round(tmp_path: Path) -> None:
    """With a state folder, round 1 (g_k = 0: the client never trained) writes its new g_k under the
    node's partition; a restarted node (a new context) reads it back in round 2 and trains with it."""
    node, start = pixel_node(), start_state()
    zeros = {name: torch.zeros_like(value) for name, value in start.items()}

    def context_for(content: RecordDict) -> Context:
        context = Context(run_id=1, node_id=77, node_config={"state-dir": str(tmp_path)}, state=RecordDict(),
                          run_config={})
        enter(context, content, str(tmp_path / "unused"))
        return context

    ins, first = feddyn_train(1, start)
    with_scope(first, StateScope(run="abc", round=1))
    model = FedDynPlugin().train(node, context_for(first), ins, first).model
    after_one = by_hand(node, 1, start, zeros, LABELS)
    assert_parameters(model, after_one)
    g1 = new_correction(zeros, after_one, start)
    assert [p.name for p in (tmp_path / "run-abc").iterdir()] == ["partition-2"]
    stored = np.load(tmp_path / "run-abc" / "partition-2" / STATE_KEY / "r0000001-a1.npz")
    for name, value in g1.items():
        np.testing.assert_allclose(stored[name], value.numpy(), rtol=1e-5, atol=1e-7)

    ins, second = feddyn_train(2, after_one)
    with_scope(second, StateScope(run="abc", round=2))
    model = FedDynPlugin().train(node, context_for(second), ins, second).model
    assert_parameters(model, by_hand(node, 2, after_one, g1, LABELS))


def test_the_rounds_learner_schedule_reaches_the_objective() -> None:
    """LSR's gamma_t travels in the instruction's schedule: the plug-in trains with it (the same model
    as FedDyn's hooks with that schedule give), not with the default of none."""
    node, start, g = pixel_node(), start_state(), some_correction()
    # A high distillation temperature: the pixel logits' tempered predictions are not saturated.
    training = TRAINING.but(learner="lsr", lsr=lsr_settings(distill_temperature=10.0))
    schedule = LearnerSchedule(distill_weight=2.0)
    context = Context(run_id=1, node_id=77, node_config={}, state=RecordDict(), run_config={})
    save_parameter_arrays(context, STATE_KEY, 2, g)
    ins, content = feddyn_train(4, start, training, schedule)
    model = FedDynPlugin().train(node, context, ins, content).model
    feddyn = training.but(prox_weight=ALPHA / 2, prox_norm="squared")
    expected = {}
    for sent in (schedule, LearnerSchedule()):
        reference, _ = local_update(node, start, LinearTerm(feddyn, sent, list(g.values())), 4)
        expected[sent] = {name: p.detach() for name, p in reference.named_parameters()}
    assert_parameters(model, expected[schedule])
    assert not torch.allclose(expected[schedule]["1.weight"], expected[LearnerSchedule()]["1.weight"])


def test_the_linear_term_keeps_its_schedule_and_is_zero_before_training_starts() -> None:
    """The hooks carry the round's schedule to the learner; before ``on_train_start`` has placed g_k
    beside the parameters, the linear term adds nothing."""
    schedule = LearnerSchedule(distill_weight=0.5, forget_rate=0.25)
    model = pixel_model()
    hooks = LinearTerm(local_training(), schedule, [torch.ones_like(p) for p in model.parameters()])
    assert hooks.schedule == schedule
    assert list(hooks.extra_losses(list(model.parameters()))) == [0]


def test_a_correction_shaped_unlike_the_parameters_is_refused_by_name() -> None:
    model = pixel_model()
    hooks = LinearTerm(local_training(), LearnerSchedule(), [torch.zeros(3) for _ in model.parameters()])
    with pytest.raises(RuntimeError, match=r"^FedDyn's correction does not match the model's parameters$"):
        hooks.on_train_start(model)


def test_a_train_instruction_without_alpha_or_the_model_names_the_server() -> None:
    # Both are read before the node is touched.
    ins = TrainIns(1, TRAINING, plugin="feddyn")
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'feddyn' is missing"):
        FedDynPlugin().train(cast(Any, None), cast(Any, None), ins, instruction(ins))
    only_alpha = instruction(ins, plugin_ins=FedDynIns(alpha=ALPHA), plugin="feddyn")
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing"):
        FedDynPlugin().train(cast(Any, None), cast(Any, None), ins, only_alpha)
