"""FedProx, FedDyn, FedMedian and Power-of-Choice: their updates on hand-checkable inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from defaults import context, local_training, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict
from omegaconf import OmegaConf

from client.plugins.feddyn import STATE_KEY, updated_correction
from client.state_store import load_parameter_arrays, save_parameter_arrays
from common.errors import ConfigError, InvalidValue
from protocol.codec import ProtocolError
from protocol.feddyn import FedDynIns
from protocol.messages import LOSS, Scores, TrainIns, TrainStats, read_instruction, read_plugin_ins, reply
from server.config import load_run
from settings.compose import compose_config
from strategies.aggregation import coordinate_median
from strategies.fedavg import FedAvg
from strategies.feddyn import FedDyn, feddyn_server_step
from strategies.federation import Federation
from strategies.fedmedian import FedMedian
from strategies.fedprox import FedProx
from strategies.poc import PowerOfChoice, _read_loss, highest_loss
from strategies.registry import plan_strategy

pytestmark = pytest.mark.usefixtures("flower_identity")

NODES = {pid: 1000 + 7 * pid for pid in range(6)}
TRAINING = local_training(lr=0.1)


def federation(sizes: dict[int, int] | None = None) -> Federation:
    return Federation(node_of=dict(NODES), num_examples=sizes or dict.fromkeys(NODES, 50))


def response(pid: int, content: RecordDict, message_type: str = "train") -> Message:
    metadata = Metadata(run_id=1, message_id="", src_node_id=NODES[pid], dst_node_id=0, reply_to_message_id="",
                        group_id="", created_at=0.0, ttl=60.0, message_type=message_type)
    return Message(content=content, metadata=metadata)


# --- FedDyn: two clients with quadratic losses L_k(w) = a_k/2 (w - c_k)^2 -----------------------------

A, C, ALPHA = np.array([1.0, 3.0]), np.array([1.0, 3.0]), 0.5


def exact_local_optimum(k: int, w_global: float, g: float) -> float:
    """The argmin of a/2 (w - c)^2 - g w + alpha/2 (w - w_global)^2 = (a c + g + alpha w_global) / (a + alpha)."""
    return (A[k] * C[k] + g + ALPHA * w_global) / (A[k] + ALPHA)


def feddyn_rounds(rounds: int) -> list[float]:
    w, h, g = 0.0, {}, [torch.zeros(1), torch.zeros(1)]
    trajectory = []
    for _ in range(rounds):
        local = [exact_local_optimum(k, w, float(g[k])) for k in range(2)]
        g = [updated_correction({"w": g[k]}, {"w": torch.tensor([local[k]])}, {"w": torch.tensor([w])}, ALPHA)["w"]
             for k in range(2)]
        states = [{"w": np.array([value])} for value in local]
        new, h = feddyn_server_step({"w": np.array([w])}, states, h, alpha=ALPHA, num_clients=2, parameter_names=["w"])
        w = float(new["w"][0])
        trajectory.append(w)
    return trajectory


def test_feddyn_first_round_matches_the_hand_computation():
    # Clients from w = 0, g = 0: w_1 = 1/1.5 = 2/3, w_2 = 9/3.5 = 18/7.
    # h = -alpha/N * (2/3 + 18/7) = -0.25 * 68/21 = -17/21; w = mean(2/3, 18/7) - h/alpha = 34/21 + 34/21.
    assert feddyn_rounds(1)[0] == pytest.approx(68 / 21)


def test_feddyn_client_correction_is_the_gradient_at_its_local_optimum():
    w_local = exact_local_optimum(1, 0.0, 0.0)
    g = updated_correction({"w": torch.zeros(1)}, {"w": torch.tensor([w_local])}, {"w": torch.tensor([0.0])}, ALPHA)
    assert float(g["w"][0]) == pytest.approx(A[1] * (w_local - C[1]))  # grad L_2 at w_local


def test_feddyn_reaches_the_global_optimum_that_fedavg_misses():
    optimum = float((A * C).sum() / A.sum())  # minimiser of L_1 + L_2: 2.5
    assert feddyn_rounds(300)[-1] == pytest.approx(optimum, abs=1e-6)
    # FedAvg with exact local solves averages the local minimisers, 2.0: not the optimum.
    assert float(C.mean()) != pytest.approx(optimum)


def test_feddyn_corrects_parameters_and_only_averages_buffers():
    start = {"w": np.zeros(2, np.float32), "bn.running_mean": np.zeros(2, np.float32)}
    states = [{"w": np.array([1.0, 2.0], np.float32), "bn.running_mean": np.array([1.0, 1.0], np.float32)},
              {"w": np.array([3.0, 2.0], np.float32), "bn.running_mean": np.array([3.0, 5.0], np.float32)}]
    new, h = feddyn_server_step(start, states, {}, alpha=0.1, num_clients=4, parameter_names=["w"])
    assert list(h) == ["w"] and np.allclose(h["w"], [-0.1 / 4 * 4, -0.1 / 4 * 4])
    assert np.allclose(new["w"], [2.0 + 1.0, 2.0 + 1.0]) and new["w"].dtype == np.float32
    assert np.allclose(new["bn.running_mean"], [2.0, 3.0])


def test_feddyn_averages_float32_parameters_in_float64_per_coordinate():
    # 2^24 + 1 + 1 + 0 is 2^24 in float32 (each + 1 rounds to even) but 2^24 + 2 in float64, so the mean of
    # the first coordinate is 2^22 + 0.5 only when summed in float64. h is chosen so that the new h is 0
    # (h - alpha/N * drift with alpha = 1, N = 4, start 0): the new global model is the plain mean.
    states = [{"w": np.array(pair, np.float32)} for pair in ([2.0**24, 3.0], [1.0, 5.0], [1.0, 5.0], [0.0, 7.0])]
    start = {"w": np.zeros(2, np.float32)}
    h = {"w": np.array([(2.0**24 + 2) / 4, 20.0 / 4])}
    new, new_h = feddyn_server_step(start, states, h, alpha=1.0, num_clients=4, parameter_names=["w"])
    assert new_h["w"].tolist() == [0.0, 0.0]
    assert new["w"].dtype == np.float32 and new["w"].tolist() == [2.0**22 + 0.5, 5.0]


def test_feddyn_step_with_a_single_client():
    # One sampled client of N = 2 from w = 1 to 2: h = -0.5/2 * 1 = -0.25, w = 2 - h/alpha = 2.5.
    new, h = feddyn_server_step({"w": np.array([1.0], np.float32)}, [{"w": np.array([2.0], np.float32)}], {},
                                alpha=0.5, num_clients=2, parameter_names=["w"])
    assert h["w"].tolist() == [-0.25] and new["w"].tolist() == [2.5] and new["w"].dtype == np.float32


def test_feddyn_sends_alpha_and_decays_the_learning_rate():
    settings = strategy_settings("feddyn", alpha=0.01, lr_decay=0.5, num_rounds=3, fraction=0.5, train=TRAINING)
    strategy = FedDyn(settings, context(parameter_names=("w",)))
    strategy.bind(federation())
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    for server_round, lr in ((1, 0.1), (2, 0.05)):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid=None))
        ins = read_instruction(messages[0].content, TrainIns)
        assert ins.plugin == "feddyn" and ins.training.lr == pytest.approx(lr)
        assert read_plugin_ins(messages[0].content, "feddyn", FedDynIns) == FedDynIns(alpha=0.01)
        replies = [response(strategy.federation.partition_of(m.metadata.dst_node_id),
                            reply(TrainStats(50, 1.0, 1), arrays=ArrayRecord({"w": Array(np.ones(2, np.float32))})))
                   for m in messages]
        arrays, _ = strategy.aggregate_train(server_round, replies)
    assert strategy.stage_rounds == 2 and "w" in strategy.h


def test_feddyn_client_state_survives_a_new_context_record():
    parameters = dict(torch.nn.Linear(2, 1).named_parameters())
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    zeros = load_parameter_arrays(context, STATE_KEY, 0, parameters)
    assert list(zeros) == list(parameters) and all(g.shape == parameters[name].shape and not g.any()
                                                    for name, g in zeros.items())
    stored = {name: torch.full_like(p, 3.0) for name, p in parameters.items()}
    save_parameter_arrays(context, STATE_KEY, 0, stored)
    assert all(torch.equal(load_parameter_arrays(context, STATE_KEY, 0, parameters)[name], value)
               for name, value in stored.items())
    with pytest.raises(RuntimeError, match="model changed"):
        load_parameter_arrays(context, STATE_KEY, 0, dict(torch.nn.Linear(2, 2, bias=False).named_parameters()))


# --- FedMedian ---------------------------------------------------------------------------------------

def test_coordinate_median_on_known_arrays():
    states = [{"w": np.array([1.0, 10.0, -1.0], np.float32), "n": np.array(3)},
              {"w": np.array([2.0, -5.0, 0.0], np.float32), "n": np.array(4)},
              {"w": np.array([9.0, 0.0, 7.0], np.float32), "n": np.array(10)},
              {"w": np.array([3.0, 1.0, 1.0], np.float32), "n": np.array(4)}]
    out = coordinate_median(states)
    assert np.allclose(out["w"], [2.5, 0.5, 0.5]) and out["w"].dtype == np.float32
    assert int(out["n"]) == 4 and out["n"].dtype == states[0]["n"].dtype


def test_coordinate_median_of_one_client_of_none_and_near_float32s_maximum():
    single = {"w": np.array([1.0, -2.0], np.float32)}
    np.testing.assert_array_equal(coordinate_median([single])["w"], single["w"])
    with pytest.raises(ValueError, match=r"^nothing to aggregate: no client states$"):
        coordinate_median([])
    # The middle pair's mean is taken in float64: 3e38 + 3e38 overflows float32.
    big = {"w": np.array([3e38], np.float32)}
    np.testing.assert_array_equal(coordinate_median([big, big])["w"], big["w"])


def test_fedmedian_ignores_an_outlier_client():
    strategy = FedMedian(strategy_settings("fedmedian", num_rounds=1, fraction=0.5, train=TRAINING), context())
    strategy.bind(federation())
    strategy.messages({pid: RecordDict() for pid in (0, 1, 2)}, "train")
    weights = {0: 1.0, 1: 1.2, 2: 1e6}
    replies = [response(pid, reply(TrainStats(50, 0.1, 1), arrays=ArrayRecord({"w": Array(np.full(3, w, np.float32))})))
               for pid, w in weights.items()]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["w"].numpy(), 1.2)


# --- FedProx -----------------------------------------------------------------------------------------

def test_fedprox_sends_half_mu_as_the_squared_proximal_weight():
    settings = strategy_settings("fedprox", mu=1.0, num_rounds=1, fraction=0.5, train=TRAINING.but(prox_norm="l2"))
    strategy = FedProx(settings, context())
    strategy.bind(federation())
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), None))
    assert len(messages) == 3
    ins = read_instruction(messages[0].content, TrainIns)
    assert ins == TrainIns(1, TRAINING.but(prox_weight=0.5, prox_norm="squared"))


# --- Power-of-Choice ---------------------------------------------------------------------------------

class LossGrid:
    """A Grid that answers ``query.loss`` with fixed losses per partition (and records the queries)."""

    def __init__(self, losses: dict[int, float]) -> None:
        self.losses = losses
        self.asked: list[int] = []

    def send_and_receive(self, messages, timeout):
        answers = []
        for message in messages:
            pid = next(p for p, node in NODES.items() if node == message.metadata.dst_node_id)
            assert message.metadata.message_type == LOSS
            self.asked.append(pid)
            answers.append(response(pid, reply(Scores(self.losses[pid], 0.5, 50)), LOSS))
        return answers


def test_highest_loss_breaks_ties_by_partition_id():
    assert highest_loss({3: 0.5, 1: 2.0, 4: 0.5, 0: 0.1}, 2) == [1, 3]


def test_poc_trains_the_highest_loss_candidates():
    losses = {0: 0.3, 1: 2.5, 2: 0.1, 3: 1.7, 4: 0.9, 5: 3.0}
    strategy = PowerOfChoice(strategy_settings("poc", d=4, num_rounds=1, fraction=0.3, train=TRAINING), context(rng=3))
    strategy.bind(federation())
    grid = LossGrid(losses)
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
    trained = sorted(strategy.federation.partition_of(m.metadata.dst_node_id) for m in messages)
    assert len(set(grid.asked)) == 4 and len(trained) == 2
    assert trained == sorted(sorted(grid.asked, key=lambda pid: -losses[pid])[:2])
    assert strategy.result_blocks() == {"poc": {"d": 4, "loss_queries": 4}}


def test_poc_pool_may_be_as_small_as_a_round_or_as_large_as_the_federation():
    # Both ends of round size <= d <= num_clients are allowed; one client fewer or more is refused.
    for d, allowed in ((2, False), (3, True), (10, True), (11, False)):
        settings = strategy_settings("poc", d=d, num_rounds=1, fraction=0.3, train=TRAINING)
        assert settings.round_size(10) == 3  # round(0.3 * 10)
        if allowed:
            settings.check_options(context(num_clients=10))
        else:
            with pytest.raises(InvalidValue, match=rf"d={d} is invalid: allowed is between the clients per round "
                                                   r"\(3\) and num_clients \(10\)"):
                settings.check_options(context(num_clients=10))


def test_poc_loss_reply_without_scores_names_its_sender():
    # A candidate's bad loss reply is reported as that client's.
    with pytest.raises(ProtocolError, match="^client 4 sent a bad message: key 'metrics' is missing"):
        _read_loss(RecordDict(), "client 4")


def test_poc_candidates_follow_data_size():
    sizes = {0: 1, 1: 1, 2: 1, 3: 1, 4: 1000, 5: 1000}
    strategy = PowerOfChoice(strategy_settings("poc", d=2, num_rounds=1, fraction=0.2, train=TRAINING), context())
    strategy.bind(federation(sizes))
    picks = [tuple(strategy.candidates(1)) for _ in range(50)]
    assert picks.count((4, 5)) >= 45


# --- config checks -----------------------------------------------------------------------------------

def plan(overrides: list[str]):
    return load_run(compose_config(overrides))


def build(overrides: list[str], parameter_names=("w",)):
    checked = plan(overrides)
    return checked.strategy.build(checked.context(parameter_names=tuple(parameter_names)))


@pytest.mark.parametrize(("overrides", "message"), [
    (["strategy=poc", "strategy.d=5"], r"strategy.d=5 is invalid: allowed is between the clients per round \(10\)"),
    (["strategy=poc", "strategy.d=101"], r"strategy.d=101 is invalid"),
    (["strategy=feddyn", "strategy.alpha=0"], r"strategy.alpha=0 is invalid: allowed is a number > 0"),
    (["strategy=feddyn", "strategy.lr_decay=1.5"], r"strategy.lr_decay=1.5 is invalid"),
    (["strategy=fedprox", "strategy.mu=-1"], r"strategy.mu=-1 is invalid"),
    (["strategy=fedavg", "strategy.num_rounds=0"], r"strategy.num_rounds=0 is invalid: allowed is an integer >= 1"),
    (["strategy=fedavg", "strategy.train.lr=0"], r"strategy.train.lr=0 is invalid: allowed is a finite number > 0"),
    (["strategy=fedavg", "+strategy.mu=1"], r"strategy config has unknown keys \['mu'\]"),
    (["strategy.stage3=poc", "strategy.stage3_options.poc.d=3"], r"strategy.stage3_options.poc.d=3 is invalid"),
    # Every strategy's block is checked, not only the one stage 3 runs.
    (["strategy.stage3=fedavg", "strategy.stage3_options.rfa.smoothing=0"],
     r"strategy.stage3_options.rfa.smoothing=0 is invalid"),
    (["strategy.stage3=fednoro"], r"strategy.stage3='fednoro' is invalid: allowed are fedavg, feddyn, fedlsr"),
    (["+strategy.stage3_options.fednoro.warmup=5"],
     r"strategy.stage3_options='fednoro' is invalid: allowed are fedavg, feddyn, fedlsr"),
    (["strategy.ablation.mixup=maybe"], r"strategy.ablation.mixup='maybe' is invalid: allowed is true or false"),
    (["+strategy.ablation.noise=false"], r"strategy.ablation config has unknown keys \['noise'\]"),
    (["strategy.frac2=0"], r"strategy.frac2=0 is invalid"),
])
def test_bad_method_options_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan(overrides)


STAGE3_CLASSES = {"fedavg": FedAvg, "fedprox": FedProx, "feddyn": FedDyn, "fedmedian": FedMedian, "poc": PowerOfChoice}


@pytest.mark.parametrize("stage3", sorted(STAGE3_CLASSES))
def test_fedcorr_builds_each_stage3_on_its_round_log(stage3):
    strategy = build(["experiment=smoke", f"strategy.stage3={stage3}"])
    assert type(strategy.stage3) is STAGE3_CLASSES[stage3]
    assert strategy.stage3.history is strategy.history and strategy.stage3.stage == "usual"
    assert strategy.stage3.num_rounds == compose_config(["experiment=smoke"]).strategy.t3


def test_stage3_gets_its_own_output_folder():
    plain = compose_config(["experiment=smoke"]).out_dir
    with_feddyn = compose_config(["experiment=smoke", "strategy.stage3=feddyn"]).out_dir
    assert plain.rsplit("/", 1)[0] == with_feddyn.rsplit("/", 1)[0], "one scene, one parent folder"
    assert plain.rsplit("/", 1)[1].startswith("fedcorr-")
    assert with_feddyn.rsplit("/", 1)[1].startswith("fedcorr+feddyn-")


def test_one_comm_budget_sets_every_methods_rounds():
    budget = ["experiment=smoke", "comm_budget=60"]  # smoke: 10 clients, 3 per round
    for name in ("fedavg", "feddyn", "poc"):
        assert build([*budget, f"strategy={name}"]).num_rounds == 20
    # FedCorr smoke: T1 = 3 iterations x 10 clients + T2 = 5 rounds x 3 = 45; stage 3 gets (60 - 45) // 3.
    assert build(budget).stage3.num_rounds == 5
    with pytest.raises(ConfigError, match="comm_budget=40 is invalid: too small; FedCorr's stages 1-2 alone spend"):
        plan(["experiment=smoke", "comm_budget=40"])
    with pytest.raises(ConfigError, match="comm_budget=2 is invalid: too small; one round spends 3"):
        plan(["experiment=smoke", "strategy=fedavg", "comm_budget=2"])


# --- standalone, in process -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["fedavg", "fedprox", "feddyn", "fedmedian", "poc"])
def test_each_round_strategy_runs_standalone_over_the_test_grid(run_inprocess, name):
    payload, grid = run_inprocess(f"experiment=smoke strategy={name} strategy.num_rounds=3 strategy.train.epochs=1")
    assert [row["stage"] for row in payload["rounds"]] == [name] * 3
    assert [row["comm_cost"] for row in payload["rounds"]] == [3, 6, 9]
    assert payload["complete"] and payload["summary"]["best_acc"] > 0.1
    confusion = np.array(payload["test_confusion"]["counts"])  # the final evaluation's, over the test split
    assert payload["test_confusion"]["round"] == 3 and confusion.shape == (10, 10)
    assert np.trace(confusion) / confusion.sum() == pytest.approx(payload["summary"]["final_acc"])
    trained = {pid for row in payload["rounds"] for pid in row["clients"]}
    with_state = {pid for pid in range(10) if grid.record_of(pid, "feddyn-correction") is not None}
    assert with_state == (trained if name == "feddyn" else set()), "only FedDyn keeps a correction, where trained"
    assert ("poc" in payload) == (name == "poc")
    if name == "poc":
        assert payload["poc"] == {"d": 6, "loss_queries": 3 * 6}
        assert grid.delivered_types().count("query.loss") == 3 * 6


def test_a_strategy_block_without_a_name_or_a_train_block_is_refused_naming_the_key():
    block = OmegaConf.to_container(compose_config(["strategy=fedavg"]).strategy, resolve=True)
    with pytest.raises(ConfigError, match=r"^strategy\.name=<unset> is invalid: the config must name a strategy$"):
        plan_strategy({k: v for k, v in block.items() if k != "name"}, context())
    with pytest.raises(ConfigError, match=r"^strategy\.train=<unset> is invalid: the config must set it$"):
        plan_strategy({k: v for k, v in block.items() if k != "train"}, context())
