"""SCAFFOLD: the server step and the client's corrected steps on hand-checkable inputs, option II's
control variate, and whole runs over the test grid, standalone and as FedCorr's stage 3."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord, RecordDict
from pixels import LABELS, PIXELS, RAW, pixel_model

from client import app as client_app
from client.label_state import store_labels
from client.node import load_node
from client.plugins.scaffold import STATE_KEY, ControlVariates, ScaffoldPlugin, updated_control
from client.state_store import load_parameter_arrays, save_parameter_arrays
from client.update import local_update
from common.errors import ConfigError
from data.transforms import BatchTransform, TransformSpec
from protocol.codec import ProtocolError
from protocol.messages import TrainIns, instruction, read_arrays, read_plugin_arrays, reply
from server.config import load_run
from settings.compose import compose_config
from strategies.scaffold import Scaffold, scaffold_server_step
from task.learner_settings import LearnerSchedule
from task.local_training import TrainStats
from task.training import train_local

SMOKE = "experiment=smoke strategy.train.epochs=1"


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def test_the_server_steps_x_by_the_mean_update_and_c_by_the_sum_of_changes_over_all_clients():
    start = {"w": np.array([1.0, 1.0], np.float32), "bn.mean": np.array([0.0], np.float32)}
    states = [{"w": np.array([3.0, 1.0], np.float32), "bn.mean": np.array([2.0], np.float32)},
              {"w": np.array([1.0, 5.0], np.float32), "bn.mean": np.array([4.0], np.float32)}]
    control = {"w": np.array([0.5, 0.5], np.float32)}
    changes = [{"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([3.0, -2.0], np.float32)}]
    new, c = scaffold_server_step(start, states, control, changes, global_lr=0.5, num_clients=8)
    # mean update (1, 2); x + 0.5 * (1, 2)
    np.testing.assert_allclose(new["w"], [1.5, 2.0])
    np.testing.assert_allclose(new["bn.mean"], [3.0])  # a buffer: the plain mean
    np.testing.assert_allclose(c["w"], [0.5 + 4.0 / 8, 0.5 + 0.0 / 8])
    assert new["w"].dtype == np.float32 and c["w"].dtype == np.float32


def test_the_server_sums_the_changes_in_float64_before_dividing_by_n():
    # 3e38 + 3e38 overflows float32 (max about 3.4e38); summed in float64 and divided by N = 10 it is 6e37
    start = {"w": np.zeros(1, np.float32)}
    control = {"w": np.zeros(1, np.float32)}
    changes = [{"w": np.array([3e38], np.float32)}, {"w": np.array([3e38], np.float32)}]
    _, c = scaffold_server_step(start, [start, start], control, changes, global_lr=1.0, num_clients=10)
    assert np.isfinite(c["w"]).all()
    np.testing.assert_allclose(c["w"], [6e37], rtol=1e-6)


def test_the_control_norm_squares_in_float64():
    # 1e20 squared overflows float32; the norm of (1e20, 1e20) is sqrt(2) * 1e20
    strategy = object.__new__(Scaffold)
    strategy.settings = SimpleNamespace(global_lr=0.5)
    strategy.control = {"w": np.array([1e20], np.float32), "b": np.array([1e20], np.float32)}
    block = strategy.result_blocks()["scaffold"]
    assert block["global_lr"] == 0.5
    assert block["control_norm"] == pytest.approx(np.sqrt(2.0) * float(np.float32(1e20)), rel=1e-12)


def test_the_hooks_keep_the_rounds_schedule_and_the_proximal_anchor():
    schedule = LearnerSchedule(distill_weight=0.5, forget_rate=0.25)
    model = pixel_model()
    hooks = ControlVariates(local_training(prox_weight=0.1), schedule,
                            [torch.zeros_like(p) for p in model.parameters()])
    assert hooks.schedule == schedule
    hooks.on_train_start(model)  # the base hooks keep the starting weights for the proximal term
    torch.testing.assert_close(flat(hooks._anchor), flat(model.parameters()))


def test_a_correction_shaped_unlike_the_parameters_is_refused_by_name():
    model = pixel_model()
    hooks = ControlVariates(local_training(), LearnerSchedule(), [torch.zeros(3) for _ in model.parameters()])
    with pytest.raises(RuntimeError, match=r"^SCAFFOLD's control variates does not match the model's parameters$"):
        hooks.on_train_start(model)


def test_before_training_starts_no_gradient_is_corrected():
    model = pixel_model()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    hooks = ControlVariates(local_training(), LearnerSchedule(), [torch.ones_like(p) for p in model.parameters()])
    hooks.after_backward(model)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())


def test_a_strategy_that_ran_no_round_reports_a_zero_control_variate():
    strategy = Scaffold(strategy_settings("scaffold", global_lr=0.5, num_rounds=1), context(parameter_names=("w",)))
    assert strategy.result_blocks() == {"scaffold": {"global_lr": 0.5, "control_norm": 0.0}}


def reading_strategy() -> Scaffold:
    """A Scaffold strategy after its first plug-in arrays: one parameter w of two entries."""
    strategy = object.__new__(Scaffold)
    strategy.global_arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    strategy.control = {"w": np.zeros(2, np.float32)}
    return strategy


def test_a_train_reply_is_read_with_the_change_shaped_like_c_and_errors_name_the_sender():
    arrays = ArrayRecord({"w": Array(np.ones(2, np.float32))})
    good = reply(TrainStats(5, 0.1, 1), arrays=arrays, plugin="scaffold",
                 plugin_arrays=ArrayRecord({"w": Array(np.array([0.5, -0.5], np.float32))}))
    np.testing.assert_array_equal(reading_strategy().read_train(good, "client 4").extra["w"], [0.5, -0.5])
    with pytest.raises(ProtocolError, match="^client 4 sent a bad message: key 'arrays' is missing"):
        reading_strategy().read_train(reply(TrainStats(5, 0.1, 1)), "client 4")
    with pytest.raises(ProtocolError, match="^client 4 sent a bad message: key 'scaffold.arrays' is missing"):
        reading_strategy().read_train(reply(TrainStats(5, 0.1, 1), arrays=arrays), "client 4")
    wrong = reply(TrainStats(5, 0.1, 1), arrays=arrays, plugin="scaffold",
                  plugin_arrays=ArrayRecord({"w": Array(np.zeros(3, np.float32))}))
    with pytest.raises(ProtocolError, match=r"^client 4 sent a bad message: .*'w' has shape \(3,\): expected \(2,\)"):
        reading_strategy().read_train(wrong, "client 4")


def test_every_gradient_is_corrected_by_c_minus_c_i():
    x = torch.from_numpy(PIXELS).float()
    lr = 0.1
    reference = pixel_model()
    grad = torch.autograd.grad(F.cross_entropy(reference(x), torch.from_numpy(LABELS)), list(reference.parameters()))
    correction = [torch.full_like(p, 0.25) + torch.arange(p.numel()).reshape(p.shape) for p in reference.parameters()]
    model = pixel_model()
    start = flat(model.parameters()).clone()
    cfg = local_training(lr=lr, momentum=0.0, epochs=1, batch_size=4)
    train_local(model, PIXELS.reshape(4, 1, 1, 2), LABELS, BatchTransform(TransformSpec(), *RAW, train=True),
                ControlVariates(cfg, LearnerSchedule(), correction), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(flat(model.parameters()), start - lr * (flat(grad) + flat(correction)))


def test_option_two_after_one_plain_step_is_the_gradient_at_x():
    x, lr = torch.from_numpy(PIXELS).float(), 0.1
    model = pixel_model()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss = F.cross_entropy(model(x), torch.from_numpy(LABELS))
    grads = dict(zip(start, torch.autograd.grad(loss, list(model.parameters()))))
    with torch.no_grad():
        trained = {name: start[name] - lr * grads[name] for name in start}
    zeros = {name: torch.zeros_like(value) for name, value in start.items()}
    new = updated_control(zeros, zeros, start, trained, steps=1, lr=lr)
    for name in start:
        torch.testing.assert_close(new[name], grads[name])
    # c_i+ = c_i - c + (x - y) / (K lr); a client that took no step keeps c_i.
    own, control = {n: v + 1.0 for n, v in zeros.items()}, {n: v + 3.0 for n, v in zeros.items()}
    moved = updated_control(own, control, start, trained, steps=2, lr=lr)
    for name in start:
        torch.testing.assert_close(moved[name], own[name] - control[name] + grads[name] / 2)
    assert updated_control(own, control, start, trained, steps=0, lr=lr) == own


def client_controls(grid, num_clients: int) -> dict[int, dict[str, np.ndarray]]:
    """Each client's kept control variate c_i, as the node reads it (clients that never trained have none)."""
    found = {}
    for pid in range(num_clients):
        record = grid.record_of(pid, STATE_KEY)
        if record is not None:
            found[pid] = {name: array.numpy() for name, array in record.items()}
    return found


def test_a_run_keeps_c_equal_to_the_mean_of_every_clients_c_i(run_inprocess):
    """The server's c starts at 0 and gains (1/N) sum (c_i+ - c_i) while each c_i gains its own change: after
    any round c = (1/N) sum over all N clients of c_i (0 for a client that never trained)."""
    payload, grid = run_inprocess(f"{SMOKE} strategy=scaffold strategy.num_rounds=4")
    assert [row["stage"] for row in payload["rounds"]] == ["scaffold"] * 4
    assert [row["comm_cost"] for row in payload["rounds"]] == [3, 6, 9, 12]
    controls = client_controls(grid, 10)
    assert set(controls) == {pid for row in payload["rounds"] for pid in row["clients"]}
    names = next(iter(controls.values())).keys()
    mean = {name: sum(c[name].astype(np.float64) for c in controls.values()) / 10 for name in names}
    expected_norm = float(np.sqrt(sum(np.sum(value ** 2) for value in mean.values())))
    assert payload["scaffold"]["control_norm"] == pytest.approx(expected_norm, rel=1e-5)
    assert expected_norm > 0 and payload["scaffold"]["global_lr"] == 1.0
    assert payload["complete"] and payload["summary"]["best_acc"] > 0.3


def test_scaffold_runs_as_fedcorrs_stage_3(run_inprocess):
    payload, grid = run_inprocess(f"{SMOKE} strategy.t1=1 strategy.t2=1 strategy.t3=2 strategy.stage3=scaffold")
    usual = [row for row in payload["rounds"] if row["stage"] == "usual"]
    assert len(usual) == 2 and "scaffold" in payload and payload["scaffold"]["control_norm"] > 0
    assert set(client_controls(grid, 10)) == {pid for row in usual for pid in row["clients"]}


@pytest.mark.parametrize("overrides", [
    ["strategy=scaffold", "strategy.train.learner=coteaching", "strategy.train.coteaching.forget_rate=0.3"],
    ["strategy.stage3=scaffold", "strategy.stage3_learner=coteaching", "strategy.train.coteaching.forget_rate=0.3"],
])
def test_control_variates_of_one_network_refuse_a_two_network_learner(overrides):
    with pytest.raises(ConfigError, match="scaffold works with one network"):
        load_run(compose_config(["experiment=smoke", *overrides]))


def test_global_lr_must_be_positive():
    with pytest.raises(ConfigError, match=r"^strategy.global_lr=0 is invalid: allowed is a number > 0.0$"):
        load_run(compose_config(["experiment=smoke", "strategy=scaffold", "strategy.global_lr=0"]))


def test_the_plug_in_trains_with_c_minus_its_own_c_i_and_sends_the_change(prepared_run, incoming, node_context):
    """Through the ClientApp: a client whose c_i is already set trains with c - c_i, keeps c_i+ and
    sends c_i+ - c_i; the same training done by hand gives the same model to the last bit."""
    overrides, _, arrays = prepared_run("experiment=smoke strategy=scaffold")
    context = node_context(overrides, 2)
    node = load_node(context)
    start = arrays.to_torch_state_dict()
    parameters = {name: start[name] for name in node.parameter_names}
    control = {name: torch.full_like(value, 0.01) for name, value in parameters.items()}
    own = {name: torch.full_like(value, -0.03) for name, value in parameters.items()}
    save_parameter_arrays(context, STATE_KEY, 2, own)
    corrected = np.roll(node.data.labels, 1)  # as FedCorr's stage 2 leaves them: training uses these
    assert not np.array_equal(corrected, node.data.labels)
    store_labels(context, node, corrected)
    # LSR reads this round's gamma_t from the instruction's schedule (0 by default)
    training = local_training(lr=0.05, momentum=0.0, epochs=1, batch_size=16, learner="lsr")
    schedule = LearnerSchedule(distill_weight=0.5)
    content = instruction(TrainIns(1, training, plugin="scaffold", schedule=schedule), arrays=arrays,
                          plugin_arrays=ArrayRecord(control),
                          plugin="scaffold")
    reply = client_app.train(incoming(content, "train"), context)

    hooks = ControlVariates(training, schedule, [control[name] - own[name] for name in parameters])
    expected, stats = local_update(node, start, hooks, 1, labels=corrected)
    trained = read_arrays(reply.content, "client 2").to_torch_state_dict()
    assert all(torch.equal(trained[name], value.detach()) for name, value in expected.state_dict().items())
    new = updated_control(own, control, parameters, dict(expected.named_parameters()), stats.steps, training.lr)
    change = read_plugin_arrays(reply.content, "scaffold", "client 2").to_torch_state_dict()
    kept = load_parameter_arrays(context, STATE_KEY, 2, parameters)
    for name in parameters:
        torch.testing.assert_close(change[name], (new[name] - own[name]).detach())
        torch.testing.assert_close(kept[name], new[name].detach())


def test_a_train_instruction_without_the_model_or_c_names_the_server():
    # Both are read before the node is touched.
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'arrays' is missing"):
        ScaffoldPlugin().train(None, None, None, RecordDict())
    with pytest.raises(ProtocolError, match="^the server sent a bad message: key 'scaffold.arrays' is missing"):
        ScaffoldPlugin().train(None, None, None, reply(TrainStats(5, 0.1, 1), arrays=arrays))
