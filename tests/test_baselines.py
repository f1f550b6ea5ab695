"""FedProx, FedDyn, FedMedian and Power-of-Choice: their updates on hand-checkable inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict

from client.feddyn import load_correction, store_correction, updated_correction
from conf import compose_config
from data.errors import ConfigError
from strategies.fedavg import FedAvg
from strategies.feddyn import ALPHA_KEY, FedDyn, feddyn_server_step
from strategies.federation import Federation
from strategies.fedmedian import FedMedian
from strategies.fedprox import FedProx
from strategies.poc import LOSS_QUERY, PowerOfChoice, highest_loss
from strategies.registry import build_strategy, check_strategy
from strategies.utils import coordinate_median

pytestmark = pytest.mark.usefixtures("flower_identity")

NODES = {pid: 1000 + 7 * pid for pid in range(6)}


def federation(sizes: dict[int, int] | None = None) -> Federation:
    return Federation(node_of=dict(NODES), num_examples=sizes or dict.fromkeys(NODES, 50))


def reply(pid: int, content: RecordDict, message_type: str = "train") -> Message:
    metadata = Metadata(run_id=1, message_id="", src_node_id=NODES[pid], dst_node_id=0, reply_to_message_id="",
                        group_id="", created_at=0.0, ttl=60.0, message_type=message_type)
    return Message(content=content, metadata=metadata)


# --- FedDyn: two clients with quadratic losses L_k(w) = a_k/2 (w - c_k)^2 -----------------------------

A, C, ALPHA = np.array([1.0, 3.0]), np.array([1.0, 3.0]), 0.5


def exact_local_optimum(k: int, w_global: float, g: float) -> float:
    """argmin a/2 (w - c)^2 - g w + alpha/2 (w - w_global)^2 = (a c + g + alpha w_global) / (a + alpha)."""
    return (A[k] * C[k] + g + ALPHA * w_global) / (A[k] + ALPHA)


def feddyn_rounds(rounds: int) -> list[float]:
    w, h, g = 0.0, {}, [torch.zeros(1), torch.zeros(1)]
    trajectory = []
    for _ in range(rounds):
        local = [exact_local_optimum(k, w, float(g[k])) for k in range(2)]
        g = [updated_correction([g[k]], {"w": torch.tensor([local[k]])}, {"w": torch.tensor([w])}, ["w"], ALPHA)[0]
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
    g = updated_correction([torch.zeros(1)], {"w": torch.tensor([w_local])}, {"w": torch.tensor([0.0])}, ["w"], ALPHA)
    assert float(g[0]) == pytest.approx(A[1] * (w_local - C[1]))  # grad L_2 at w_local


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


def test_feddyn_sends_alpha_and_decays_the_learning_rate():
    strategy = FedDyn(alpha=0.01, lr_decay=0.5, parameter_names=["w"], num_rounds=3, fraction=0.5,
                      rng=np.random.default_rng(0))
    strategy.bind(federation())
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    for server_round, lr in ((1, 0.1), (2, 0.05)):
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord({"lr": 0.1}), grid=None))
        config = messages[0].content["config"]
        assert config[ALPHA_KEY] == 0.01 and config["lr"] == pytest.approx(lr)
        replies = [reply(strategy.federation.partition_of(m.metadata.dst_node_id),
                         RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32))}),
                                     "metrics": MetricRecord({"num-examples": 50, "train_loss": 1.0})}))
                   for m in messages]
        arrays, _ = strategy.aggregate_train(server_round, replies)
    assert strategy.rounds_done == 2 and "w" in strategy.h


def test_feddyn_client_state_survives_a_new_context_record():
    parameters = dict(torch.nn.Linear(2, 1).named_parameters())
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    zeros = load_correction(context, 0, parameters)
    assert [g.shape for g in zeros] == [p.shape for p in parameters.values()] and all(not g.any() for g in zeros)
    stored = [torch.full_like(p, 3.0) for p in parameters.values()]
    store_correction(context, 0, list(parameters), stored)
    assert all(torch.equal(a, b) for a, b in zip(load_correction(context, 0, parameters), stored))
    with pytest.raises(RuntimeError, match="model changed"):
        load_correction(context, 0, dict(torch.nn.Linear(2, 2, bias=False).named_parameters()))


# --- FedMedian ---------------------------------------------------------------------------------------

def test_coordinate_median_on_known_arrays():
    states = [{"w": np.array([1.0, 10.0, -1.0], np.float32), "n": np.array(3)},
              {"w": np.array([2.0, -5.0, 0.0], np.float32), "n": np.array(4)},
              {"w": np.array([9.0, 0.0, 7.0], np.float32), "n": np.array(10)},
              {"w": np.array([3.0, 1.0, 1.0], np.float32), "n": np.array(4)}]
    out = coordinate_median(states)
    assert np.allclose(out["w"], [2.5, 0.5, 0.5]) and out["w"].dtype == np.float32
    assert int(out["n"]) == 4 and out["n"].dtype == states[0]["n"].dtype


def test_fedmedian_ignores_an_outlier_client():
    strategy = FedMedian(num_rounds=1, fraction=0.5, rng=np.random.default_rng(0))
    strategy.bind(federation())
    strategy.messages({pid: RecordDict() for pid in (0, 1, 2)}, "train")
    weights = {0: 1.0, 1: 1.2, 2: 1e6}
    replies = [reply(pid, RecordDict({"arrays": ArrayRecord({"w": Array(np.full(3, w, np.float32))}),
                                      "metrics": MetricRecord({"num-examples": 50, "train_loss": 0.1})}))
               for pid, w in weights.items()]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["w"].numpy(), 1.2)


# --- FedProx -----------------------------------------------------------------------------------------

def test_fedprox_sends_half_mu_as_the_squared_proximal_weight():
    strategy = FedProx(mu=1.0, num_rounds=1, fraction=0.5, rng=np.random.default_rng(0))
    strategy.bind(federation())
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord({"lr": 0.01, "prox_weight": 0.0}), None))
    assert len(messages) == 3
    config = messages[0].content["config"]
    assert (config["prox_weight"], config["prox_norm"], config["server-round"]) == (0.5, "squared", 1)


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
            assert message.metadata.message_type == LOSS_QUERY
            self.asked.append(pid)
            answers.append(reply(pid, RecordDict({"metrics": MetricRecord({"loss": self.losses[pid]})}), LOSS_QUERY))
        return answers


def test_highest_loss_breaks_ties_by_partition_id():
    assert highest_loss({3: 0.5, 1: 2.0, 4: 0.5, 0: 0.1}, 2) == [1, 3]


def test_poc_trains_the_highest_loss_candidates():
    losses = {0: 0.3, 1: 2.5, 2: 0.1, 3: 1.7, 4: 0.9, 5: 3.0}
    strategy = PowerOfChoice(d=4, timeout=5.0, num_rounds=1, fraction=0.3, rng=np.random.default_rng(3))
    strategy.bind(federation())
    grid = LossGrid(losses)
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord({"lr": 0.01}), grid))
    trained = sorted(strategy.federation.partition_of(m.metadata.dst_node_id) for m in messages)
    assert len(set(grid.asked)) == 4 and len(trained) == 2
    assert trained == sorted(sorted(grid.asked, key=lambda pid: -losses[pid])[:2])
    assert strategy.extra_results() == {"poc": {"d": 4, "loss_queries": 4}}


def test_poc_candidates_follow_data_size():
    sizes = {0: 1, 1: 1, 2: 1, 3: 1, 4: 1000, 5: 1000}
    strategy = PowerOfChoice(d=2, timeout=5.0, num_rounds=1, fraction=0.2, rng=np.random.default_rng(0))
    strategy.bind(federation(sizes))
    picks = [tuple(strategy.candidates()) for _ in range(50)]
    assert picks.count((4, 5)) >= 45


# --- config checks -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "message"), [
    (["strategy=poc", "strategy.d=5"], r"strategy.d=5 is invalid: allowed is between the clients per round \(10\)"),
    (["strategy=poc", "strategy.d=101"], r"strategy.d=101 is invalid"),
    (["strategy=feddyn", "strategy.alpha=0"], r"strategy.alpha=0"),
    (["strategy=feddyn", "strategy.lr_decay=1.5"], r"strategy.lr_decay=1.5"),
    (["strategy=fedprox", "strategy.mu=-1"], r"strategy.mu=-1"),
    (["strategy.stage3=poc", "strategy.stage3_options.poc.d=3"], r"strategy.stage3_options.poc.d=3 is invalid"),
    (["strategy.stage3=scaffold"], r"strategy.stage3='scaffold' is unknown: allowed are fedavg, fedprox, feddyn"),
])
def test_bad_method_options_are_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_strategy(compose_config(overrides))


STAGE3_CLASSES = {"fedavg": FedAvg, "fedprox": FedProx, "feddyn": FedDyn, "fedmedian": FedMedian, "poc": PowerOfChoice}


@pytest.mark.parametrize("stage3", sorted(STAGE3_CLASSES))
def test_fedcorr_builds_each_stage3_on_its_round_log(stage3):
    cfg = compose_config(["experiment=smoke", f"strategy.stage3={stage3}"])
    strategy = build_strategy(cfg, np.random.default_rng(0), parameter_names=["w"])
    assert type(strategy.stage3) is STAGE3_CLASSES[stage3]
    assert strategy.stage3.history is strategy.history and strategy.stage3.stage == "usual"
    assert strategy.stage3.num_rounds == cfg.strategy.t3


def test_stage3_gets_its_own_output_folder():
    plain = compose_config(["experiment=smoke"]).out_dir
    assert plain.endswith("/fedcorr")
    assert compose_config(["experiment=smoke", "strategy.stage3=feddyn"]).out_dir == plain + "+feddyn"


def test_one_comm_budget_sets_every_methods_rounds():
    budget = ["experiment=smoke", "comm_budget=60"]  # smoke: 10 clients, 3 per round
    for name in ("fedavg", "feddyn", "poc"):
        strategy = build_strategy(compose_config([*budget, f"strategy={name}"]), np.random.default_rng(0), parameter_names=["w"])
        assert strategy.num_rounds == 20
    # FedCorr smoke: T1 = 3 iterations x 10 clients + T2 = 5 rounds x 3 = 45; stage 3 gets (60 - 45) // 3.
    fedcorr = build_strategy(compose_config(budget), np.random.default_rng(0), parameter_names=["w"])
    assert fedcorr.stage3.num_rounds == 5
    with pytest.raises(ConfigError, match="comm_budget=40 is too small: FedCorr's stages 1-2 alone spend"):
        check_strategy(compose_config(["experiment=smoke", "comm_budget=40"]))
    with pytest.raises(ConfigError, match="comm_budget=2 is too small: one fedavg round spends 3"):
        check_strategy(compose_config(["experiment=smoke", "strategy=fedavg", "comm_budget=2"]))
