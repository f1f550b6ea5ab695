"""FedES: the quality estimate, SeGD and NaAgg on hand-checkable inputs, its settings, and a whole run."""

from __future__ import annotations

import io
import logging
import sys
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from defaults import context, local_training, lsr_settings, strategy_settings
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from pixels import IMAGES, LABELS, PIXELS, RAW, pixel_model
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from client import app as client_app
from client.label_state import store_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin
from client.plugins.fedes import FedESPlugin, kept_criticality
from common.errors import ConfigError, InvalidValue
from common.seeding import rng_for
from data.client_data import ClientData
from data.transforms import BatchTransform, TransformSpec
from protocol.codec import ProtocolError
from protocol.fedes import PLUGIN, SeGdIns
from protocol.messages import TrainIns, TrainStats, instruction, read_instruction, read_plugin_ins, read_reply
from server.config import load_run
from settings.compose import compose_config
from strategies import fedes_quality
from strategies.base import TrainReply
from strategies.federation import Federation
from strategies.fedes import ESTIMATE, PRETRAIN, SEGD, FedES, naagg_weights, phase_of, spearman
from strategies.fedes_quality import (
    cop_summary,
    criticality,
    estimate_quality,
    flat,
    min_max_quality,
    parameter_set,
    signed_distance,
    wasserstein_1d,
)
from strategies.ground_truth import GroundTruth
from task.critical_parameters import in_parameter_set
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining
from task.selective_gradient import critical_mask, selective_gradient, update_criticality

TRAINING = local_training(lr=0.05, epochs=1, batch_size=16)


def segd(**changes) -> SeGdIns:
    """A SeGD instruction with the conf's switches, and ``changes``."""
    s = strategy_settings("fedes")
    return SeGdIns(**{"mask_params": s.mask_params, "strict_freeze": s.strict_freeze, "mask": s.mask, **changes})


# --- the quality estimate (server) ---------------------------------------------------------------

def test_cop_is_the_update_times_the_starting_weight():
    after, start = np.array([1.5, -2.0, 0.0, 7.0]), np.array([1.0, -1.0, 2.0, 0.0])
    # updates 0.5, -1, -2, 7 times weights 1, -1, 2, 0; a weight at 0 is never critical.
    np.testing.assert_allclose(criticality(after, start), [0.5, 1.0, 4.0, 0.0])


def test_emd_of_equal_size_samples_is_the_mean_gap_of_their_sorted_values():
    assert wasserstein_1d(np.array([3.0, 1.0, 2.0]), np.array([0.0, 6.0, 0.0])) == pytest.approx((1 + 2 + 3) / 3)
    same = np.array([0.2, 0.9, 0.4])
    assert wasserstein_1d(same, same[::-1].copy()) == 0.0, "one distribution in another order"
    with pytest.raises(ValueError, match="one size"):
        wasserstein_1d(np.zeros(2), np.zeros(3))


def test_the_distance_takes_the_sign_of_the_summaries_and_sign_zero_is_zero():
    assert signed_distance(2.0, 1.0, 0.3) == 0.3
    assert signed_distance(0.5, 1.0, 0.3) == -0.3
    assert signed_distance(1.0, 1.0, 0.3) == 0.0
    assert signed_distance(2.0, 1.0, 0.0) == 0.0, "one distribution: no distance whatever the sign"


def test_rho_is_the_min_max_normalised_distance_with_an_optional_floor():
    assert min_max_quality({0: -1.0, 1: 1.0, 2: 0.0}) == {0: 0.0, 1: 1.0, 2: 0.5}
    assert min_max_quality({0: -1.0, 1: 1.0, 2: 0.0}, floor=0.1) == {0: 0.1, 1: 1.0, 2: 0.5}
    # No client differs from another: every rho is 1 (FedES becomes FedAvg) instead of 0/0.
    assert min_max_quality({3: 0.2, 5: 0.2}) == {3: 1.0, 5: 1.0}


def test_mu_is_the_mean_of_the_higher_gmm_component_at_cop_scale(monkeypatch):
    rng = np.random.default_rng(0)
    values = 1e-5 * np.concatenate([rng.normal(1.0, 0.05, 900), rng.normal(5.0, 0.05, 100)])
    assert cop_summary(values, "arithmetic_mean", seed=1) == pytest.approx(values.mean())
    # At 1e-5 scale scikit-learn's variance floor would merge the components; in units of spread it does not.
    assert cop_summary(values, "gmm", seed=1) == pytest.approx(5e-5, rel=0.01)
    assert cop_summary(np.full(5, 3e-4), "gmm", seed=1) == pytest.approx(3e-4), "one population: its mean"
    monkeypatch.setattr(fedes_quality, "GMM_SAMPLE", 200)
    subsampled = cop_summary(values, "gmm", seed=1)
    assert subsampled == cop_summary(values, "gmm", seed=1), "the subsample comes from the seed"
    assert subsampled == pytest.approx(5e-5, rel=0.02)


def test_estimate_on_two_clients_by_hand():
    start = {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), "b": np.zeros(2, np.float32),
             "buffer": np.ones((2, 2), np.float32)}
    clean = {**start, "w": start["w"] + 0.4}  # CoP 0.4, 0.8, 1.2, 1.6: mean 1.0
    noisy = {**start, "w": start["w"] + np.array([[0, 0], [0, 0.1]], np.float32),  # CoP 0, 0, 0, 0.4: mean 0.1
             "b": np.full(2, 50.0, np.float32), "buffer": np.full((2, 2), 50.0, np.float32)}
    aggregate = {key: (clean[key] + noisy[key]) / 2 for key in start}  # CoP 0.2, 0.4, 0.6, 1.0: mean 0.55
    names = parameter_set(start, ["w", "b"], "weights")
    assert names == ["w"] and parameter_set(start, ["w", "b"], "all") == ["w", "b"], "buffers are never in P"
    estimate = estimate_quality(start, {0: clean, 1: noisy}, aggregate, names, estimator="arithmetic_mean", seed=1)
    # Sorted gaps to the global CoP: 0.2, 0.4, 0.6, 0.6 for both clients, EMD 0.45, signs + and -.
    assert estimate.distance == pytest.approx({0: 0.45, 1: -0.45})
    assert estimate.mu == pytest.approx({0: 1.0, 1: 0.1}) and estimate.mu_global == pytest.approx(0.55)
    assert estimate.rho == {0: 1.0, 1: 0.0}
    # D2's other reading: client 0 measured from its own upload, which it did not change: CoP 0,
    # EMD to the global CoP 0.55 with the sign -, below client 1's -0.45.
    own = estimate_quality(start, {0: clean, 1: noisy}, aggregate, names, estimator="arithmetic_mean", seed=1,
                           client_starts={0: clean})
    assert own.distance == pytest.approx({0: -0.55, 1: -0.45}) and own.rho == {0: 0.0, 1: 1.0}


def test_an_unknown_mu_estimator_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"^mu estimator 'median' is unknown: allowed are gmm, arithmetic_mean$"):
        cop_summary(np.ones(3), "median", seed=1)


def test_the_gmm_needs_two_distinct_entries_and_a_spread_above_the_tolerance():
    """Two distinct entries are two components, the higher one the larger entry; a spread of at most
    1e-12 times the magnitude (at least 1e-12) is one population, summarised by its mean."""
    assert cop_summary(np.array([1e-5, 3e-5]), "gmm", seed=1) == pytest.approx(3e-5, rel=1e-9)
    assert cop_summary(np.array([0.0, 1e-12]), "gmm", seed=1) == 5e-13, "a spread at the tolerance: one population"
    assert cop_summary(np.array([0.0, 1.5e-12]), "gmm", seed=1) == pytest.approx(1.5e-12, rel=1e-9, abs=0), \
        "below magnitude 1 the tolerance is 1e-12 itself"
    # Above magnitude 1 the tolerance grows with it: 1e-12 * 1e12 = 1 here, so a spread of 0.5 is one population.
    assert cop_summary(np.array([1e12, 1e12 + 0.5]), "gmm", seed=1) == 1e12 + 0.25


def test_the_higher_of_two_components_holds_the_top_two_of_three_clusters():
    rng = np.random.default_rng(0)
    values = 1e-5 * np.concatenate([rng.normal(centre, 0.05, 101) for centre in (1.0, 5.0, 6.0)])
    # Two components: {1} and {5, 6}, whose mean is 5.5 (a third component would split off 6).
    assert cop_summary(values, "gmm", seed=1) == pytest.approx(5.5e-5, rel=0.01)


def three_even_clusters() -> np.ndarray:
    """CoP values in three equal clusters at 1, 2 and 3 (x 1e-5): a 2-component GMM may take the top
    cluster alone (mean 3e-5) or the top two (2.5e-5), as its start decides."""
    rng = np.random.default_rng(0)
    return 1e-5 * np.concatenate([rng.normal(centre, 0.05, 100) for centre in (1.0, 2.0, 3.0)])


def test_the_gmm_starts_from_the_run_seed():
    """On data where the GMM's start decides the fit, a seed gives one summary every time (a run is
    reproducible) and the seed is what decides it."""
    values = three_even_clusters()
    summaries = [cop_summary(values, "gmm", seed=seed) for seed in range(20)]
    assert [cop_summary(values, "gmm", seed=seed) for seed in range(20)] == summaries
    assert min(summaries) == pytest.approx(2.5e-5, rel=0.01) and max(summaries) == pytest.approx(3e-5, rel=0.01)


def test_a_vector_of_exactly_the_sample_size_is_fitted_whole(monkeypatch):
    """At most GMM_SAMPLE entries are fitted: a vector of exactly that many is not resampled (a
    resampled copy, in another order, can start the GMM elsewhere on these clusters)."""
    values = three_even_clusters()
    whole = [cop_summary(values, "gmm", seed=seed) for seed in range(6)]
    monkeypatch.setattr(fedes_quality, "GMM_SAMPLE", values.size)
    assert [cop_summary(values, "gmm", seed=seed) for seed in range(6)] == whole


def sample_positions(seed: int, size: int, count: int) -> np.ndarray:
    """The positions of the GMM's subsample: ``count`` distinct ones from the run seed's own stream."""
    return rng_for(seed, "fedes-mu-sample").choice(size, count, replace=False)


def test_the_subsample_is_distinct_entries_at_the_seeds_positions(monkeypatch):
    """With a subsample of two, mu is the larger of the two entries drawn (two components, one each):
    the entries at the positions the run seed's ``fedes-mu-sample`` stream draws without replacement."""
    monkeypatch.setattr(fedes_quality, "GMM_SAMPLE", 2)
    values = np.arange(1.0, 301.0)
    for seed in range(4):
        expected = values[sample_positions(seed, 300, 2)].max()
        assert cop_summary(values, "gmm", seed=seed) == pytest.approx(expected, rel=1e-9)


def test_estimate_with_subsampled_gmm_summaries_and_a_floor(monkeypatch):
    """Every CoP vector of one length is summarised at the same seeded positions. Clients whose CoPs
    are v and 3 v around a FedAvg CoP of 2 v: mu is the larger drawn entry of each vector, the EMDs are
    both mean(v) = 36/64, the signs - and +; the floor lifts the worse client's rho."""
    monkeypatch.setattr(fedes_quality, "GMM_SAMPLE", 2)
    v = np.arange(1.0, 9.0) / 8
    start = {"w": np.ones((2, 4))}
    clients = {0: {"w": 1 + v.reshape(2, 4)}, 1: {"w": 1 + 3 * v.reshape(2, 4)}}
    aggregate = {"w": 1 + 2 * v.reshape(2, 4)}
    for seed in (1, 2):
        estimate = estimate_quality(start, clients, aggregate, ["w"], estimator="gmm", seed=seed, floor=0.25)
        top = v[sample_positions(seed, 8, 2)].max()
        assert estimate.mu == pytest.approx({0: top, 1: 3 * top}, rel=1e-9)
        assert estimate.mu_global == pytest.approx(2 * top, rel=1e-9)
        assert estimate.distance == pytest.approx({0: -36 / 64, 1: 36 / 64})
        assert estimate.rho == {0: 0.25, 1: 1.0}


def test_no_client_no_rho():
    assert min_max_quality({}) == {}


def test_the_cop_is_computed_in_float64_whatever_the_uploads_precision():
    """float32 uploads are widened first: (2s - s) * s for s = 1 + 2^-12 is 1 + 2^-11 + 2^-24 exactly,
    which float32 would round to 1 + 2^-11."""
    s = np.float32(1 + 2**-12)
    start, after = {"w": np.full((1, 2), s)}, {"w": np.full((1, 2), 2 * s)}
    widened = flat(after, ["w"])
    assert widened.dtype == np.float64
    assert criticality(widened, flat(start, ["w"])).tolist() == [1 + 2**-11 + 2**-24] * 2


def test_spearman_of_ranks():
    assert spearman([0.1, 0.5, 0.9], [0.2, 0.3, 1.0]) == pytest.approx(1.0)
    assert spearman([0.1, 0.5, 0.9], [1.0, 0.3, 0.2]) == pytest.approx(-1.0)
    assert spearman([1.0, 1.0], [0.2, 0.3]) is None
    assert spearman([0.2, 0.3], [1.0, 1.0]) is None, "a constant truth has no ranks either"
    assert spearman([0.1, 0.5], [0.0, 1.0]) == pytest.approx(1.0), "two clients already rank"


# --- SeGD (client) -------------------------------------------------------------------------------

def two_layers(weight_grads: list[list[list[float]]], bias_grad: float = 7.0) -> nn.Sequential:
    """Linear(2, 2) -> Linear(2, 1) with every parameter 1 (so c = |grad|) and the given weight gradients."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(1.0)
    for layer, grads in zip(model, weight_grads):
        layer.weight.grad = torch.tensor(grads)
        layer.bias.grad = torch.full_like(layer.bias, bias_grad)
    return model


def grads(model: nn.Module) -> list[list[float]]:
    return [param.grad.flatten().tolist() for param in model.parameters()]


def test_the_mask_ranks_all_of_p_at_once_and_scales_the_kept_gradient():
    model = two_layers([[[1.0, -5.0], [3.0, 0.5]], [[4.0, 3.5]]])
    selective_gradient(model, rho=0.5)()
    # m = 6, k = 3: the top three |G * W| over both layers are 5, 4 and 3.5 (a per-layer top half
    # would keep 3 too); they keep half their gradient, the biases keep all of theirs.
    assert grads(model) == [[0.0, -2.5, 0.0, 0.0], [7.0, 7.0], [2.0, 1.75], [7.0]]


def test_the_mask_uses_the_weights_keeps_ties_and_rho_zero_stops_p():
    model = two_layers([[[4.0, 4.0], [4.0, 1.0]], [[1.0, 9.0]]])
    with torch.no_grad():
        model[1].weight[0, 1] = 0.0  # its gradient is large but |G * W| = 0
    selective_gradient(model, rho=2 / 6)()
    # k = 2 but three entries tie at the 2nd largest criticality 4: all three are kept.
    np.testing.assert_allclose(sum(grads(model), []), [4 / 3, 4 / 3, 4 / 3, 0.0, 7.0, 7.0, 0.0, 0.0, 7.0])
    model = two_layers([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]])
    selective_gradient(model, rho=0.0)()
    assert grads(model) == [[0.0] * 4, [7.0, 7.0], [0.0, 0.0], [7.0]]
    assert critical_mask(torch.tensor([3.0, 1.0, 2.0]), 0.0).tolist() == [True, False, False], "k is at least 1"


def test_mask_params_all_ranks_the_biases_too():
    model = two_layers([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]]], bias_grad=0.5)
    assert not in_parameter_set((2,), "weights") and in_parameter_set((2,), "all")
    selective_gradient(model, rho=0.5, mask_params="all")()  # m = 9, k = 4: 6, 5, 4, 3
    assert grads(model) == [[0.0, 0.0, 1.5, 2.0], [0.0, 0.0], [2.5, 3.0], [0.0]]


def test_frozen_parameters_are_outside_p_and_nothing_is_masked_before_a_backward_pass():
    model = two_layers([[[1.0, -5.0], [3.0, 0.5]], [[4.0, 3.5]]])
    model[0].weight.requires_grad_(False)
    # P is the second weight matrix alone: m = 2, k = 1 keeps |4 * 1| at half its gradient.
    assert selective_gradient(model, rho=0.5)() is None, "by default only the gradient is masked"
    assert grads(model) == [[1.0, -5.0, 3.0, 0.5], [7.0, 7.0], [2.0, 0.0], [7.0]]
    fresh = nn.Linear(3, 1)
    assert selective_gradient(fresh, rho=0.5, strict_freeze=True)() is None
    assert fresh.weight.grad is None


@pytest.mark.parametrize("rho", [-0.1, 1.5])
def test_rho_outside_the_unit_interval_is_refused(rho: float):
    with pytest.raises(ValueError, match=rf"^rho={rho} is invalid: allowed is a number in \[0, 1\]$"):
        selective_gradient(nn.Linear(2, 1), rho=rho)


def masked_step(strict_freeze: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two SGD steps (momentum 0.9, weight decay 0.1) on Linear(4, 1): a plain one, then SeGD at
    rho = 1/4. Returns (weights before and after the SeGD step, the entry SeGD kept)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    for rho in (1.0, 0.25):
        hook = selective_gradient(model, rho=rho, strict_freeze=strict_freeze)
        optimizer.zero_grad()
        model(x).sum().backward()
        kept = (x * model.weight.detach()).abs().argmax()  # d(sum)/dW = x: the most critical entry
        after_step = hook()
        # As train_local does: only the strict freeze has work after the step, and only under SeGD.
        assert (after_step is not None) == (strict_freeze and rho < 1.0)
        before = model.weight.detach().clone()
        optimizer.step()
        if after_step is not None:
            after_step()
    return before.flatten(), model.weight.detach().flatten(), kept


def test_the_static_mask_keeps_the_top_of_a_fixed_ranking_whatever_the_gradient():
    model = two_layers([[[1.0, -5.0], [3.0, 0.5]], [[4.0, 3.5]]])
    # P = the two weight matrices (6 entries); k = 3 of the fixed ranking: entries 0, 3 and 5.
    fixed = torch.tensor([9.0, 1.0, 2.0, 8.0, 0.0, 7.0])
    adjust = selective_gradient(model, rho=0.5, fixed_criticality=fixed)
    adjust()
    assert grads(model) == [[0.5, 0.0, 0.0, 0.25], [7.0, 7.0], [0.0, 1.75], [7.0]]
    with pytest.raises(ValueError, match=r"one value per entry of P, \(6,\)"):
        selective_gradient(model, rho=0.5, fixed_criticality=torch.ones(5))


def test_the_clients_cop_is_the_servers_for_the_same_update():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    start = {name: value.clone() for name, value in model.state_dict().items()}
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param))
    after = {name: value.numpy() for name, value in model.state_dict().items()}
    before = {name: value.numpy() for name, value in start.items()}
    names = parameter_set(before, [name for name, _ in model.named_parameters()], "weights")
    np.testing.assert_allclose(update_criticality(model, start, "weights").numpy(),
                               criticality(flat(after, names), flat(before, names)), rtol=1e-6)


def test_strict_freeze_keeps_masked_weights_where_momentum_would_move_them():
    before, after, kept = masked_step(strict_freeze=False)
    assert (after != before).all(), "released code: momentum and weight decay move masked weights"
    before, after, kept = masked_step(strict_freeze=True)
    moved = (after != before).nonzero().flatten().tolist()
    assert moved == [int(kept)], "strict freeze: only the kept entry moves"


def test_the_kept_gradient_is_scaled_in_the_parameters_own_precision():
    model = nn.Linear(2, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    model.weight.grad = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    selective_gradient(model, rho=0.1)()  # m = 2, k = max(1, floor(0.2)) = 1: the 3 is kept
    # 0.1 has no exact float32 value: a float64 gradient is scaled by the float64 0.1.
    assert model.weight.grad.tolist() == [[0.0, 3.0 * 0.1]]


class OneDevicePerOperation(TorchDispatchMode):
    """Refuses an operation on tensors of two devices, as CUDA does (the meta device, which stands in
    for a GPU here, lets an in-place one through)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        devices = {tensor.device for tensor in tensors if tensor.dim()}  # a 0-d CPU tensor is a scalar
        if len(devices) > 1:
            raise RuntimeError(f"{func} mixes the devices {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def test_a_static_mask_measured_on_the_cpu_follows_the_model_to_its_device():
    # update_criticality measures on the CPU; the mask must move to where the gradients are.
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)).to("meta")
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    adjust = selective_gradient(model, rho=0.5, fixed_criticality=torch.tensor([9.0, 1.0, 2.0, 8.0, 0.0, 7.0]))
    with OneDevicePerOperation():
        adjust()
    assert all(param.grad.device.type == "meta" for param in model.parameters())


# --- the client plug-in on a hand-checkable node ----------------------------------------------------

CORRECTED = np.array([1, 1, 0, 1])  # labels as a FedCorr correction leaves them: training must use these


class PixelNode(LocalNode):
    """A node whose model is ``pixels.pixel_model`` (logits = the two raw pixels: P is its 2 x 2
    weight) and whose data are the four pixel images; its random stream per round is LocalNode's own."""

    def new_model(self) -> nn.Module:
        return pixel_model()

    def model_for_state(self, state_keys: Any) -> nn.Module:
        return pixel_model()


def pixel_node() -> PixelNode:
    transform = BatchTransform(TransformSpec(), *RAW, train=True)
    data = ClientData(IMAGES.copy(), LABELS.copy(), LABELS.copy(), np.arange(4))
    return PixelNode(2, cast(Any, SimpleNamespace(seed=5)), cast(Any, None), data, transform, transform,
                     torch.device("cpu"))


def empty_context() -> Context:
    return Context(run_id=1, node_id=77, node_config={}, state=RecordDict(), run_config={})


PIXEL_START = {"1.weight": torch.tensor([[1.0, 0.2], [-0.1, 0.8]]), "1.bias": torch.tensor([0.05, -0.05])}


def segd_train(server_round: int, options: SeGdIns, training: LocalTraining,
               schedule: LearnerSchedule | None = None) -> tuple[TrainIns, RecordDict]:
    """A FedES train instruction from ``PIXEL_START`` and its message content."""
    ins = TrainIns(server_round, training, plugin=PLUGIN, schedule=schedule or LearnerSchedule())
    return ins, instruction(ins, arrays=ArrayRecord(dict(PIXEL_START)), plugin_ins=options, plugin=PLUGIN)


def pixel_objective(w: dict[str, torch.Tensor], rows: torch.Tensor, labels: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(PIXELS).float()[rows]
    return F.cross_entropy(x @ w["1.weight"].T + w["1.bias"], torch.from_numpy(labels)[rows])


def trained_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def test_segd_at_rho_one_is_plain_sgd_on_the_current_labels_in_the_rounds_order():
    """At rho = 1 every gradient keeps its scale 1: the plug-in takes plain SGD steps (lr 0.1, batches of 2
    in the order of the node's first permutation for round 3) on the node's corrected labels."""
    node, context = pixel_node(), empty_context()
    store_labels(context, node, CORRECTED)
    ins, content = segd_train(3, segd(rho=1.0), local_training(lr=0.1, momentum=0.0, epochs=1, batch_size=2))
    model = FedESPlugin().train(node, context, ins, content).model
    w = {name: value.clone().requires_grad_(True) for name, value in PIXEL_START.items()}
    for rows in torch.randperm(4, generator=node.generator(3)).split(2):
        grads = torch.autograd.grad(pixel_objective(w, rows, CORRECTED), list(w.values()))
        w = {name: (w[name] - 0.1 * grad).detach().requires_grad_(True) for name, grad in zip(w, grads)}
    trained = trained_parameters(model)
    for name, value in w.items():
        torch.testing.assert_close(trained[name], value.detach())


def test_mask_params_all_ranks_the_biases_with_the_weights_on_the_client():
    """One step (all four samples) at rho = 1/2 with ``mask_params=all``: P is the 4 weights and the
    2 biases, k = 3; the entries with the top three |G W| take half their step, the rest none."""
    node, context = pixel_node(), empty_context()
    ins, content = segd_train(1, segd(rho=0.5, mask_params="all"),
                              local_training(lr=0.1, momentum=0.0, weight_decay=0.0, epochs=1, batch_size=4))
    model = FedESPlugin().train(node, context, ins, content).model
    w = {name: value.clone().requires_grad_(True) for name, value in PIXEL_START.items()}
    grads = dict(zip(w, torch.autograd.grad(pixel_objective(w, torch.arange(4), LABELS), list(w.values()))))
    criticality = torch.cat([(grads[name] * PIXEL_START[name]).abs().flatten() for name in w])
    third = criticality.sort(descending=True).values[2]
    kept = criticality >= third
    assert int(kept.sum()) == 3 and not kept[4:].any(), "the biases rank low: they stop (plainly they would move)"
    offset, trained = 0, trained_parameters(model)
    for name, start in PIXEL_START.items():
        mask = kept[offset:offset + start.numel()].reshape(start.shape)
        offset += start.numel()
        torch.testing.assert_close(trained[name], start - 0.1 * 0.5 * mask * grads[name])


def test_segd_at_rho_one_keeps_the_instructions_learner_schedule_and_proximal_term():
    """The plug-in trains as plain local training does with the instruction's learner (LSR's gamma_t
    from the round's schedule) and its proximal term; SeGD at rho = 1 changes nothing of it."""
    node = pixel_node()
    training = local_training(lr=0.1, momentum=0.0, epochs=1, batch_size=2, prox_weight=0.3, learner="lsr",
                              lsr=lsr_settings(distill_temperature=10.0))
    models = {}
    for schedule in (LearnerSchedule(distill_weight=2.0), LearnerSchedule()):
        ins, content = segd_train(4, segd(rho=1.0), training, schedule)
        plain = ClientPlugin().train(node, empty_context(), ins, content).model
        model = FedESPlugin().train(node, empty_context(), ins, content).model
        for name, value in trained_parameters(plain).items():
            torch.testing.assert_close(trained_parameters(model)[name], value)
        models[schedule.distill_weight] = trained_parameters(model)["1.weight"]
    assert not torch.allclose(models[2.0], models[0.0]), "the schedule's gamma_t changes the update"


def test_a_static_mask_without_a_kept_cop_says_why():
    with pytest.raises(RuntimeError, match=r"^client 2 has no CoP from an estimation round for FedES's static mask; "
                                           r"a node that restarts mid-run keeps it only with a state-dir$"):
        kept_criticality(empty_context(), pixel_node())


def test_a_message_without_arrays_is_a_protocol_error_from_the_server():
    ins = TrainIns(1, TRAINING, plugin=PLUGIN)
    content = instruction(ins, plugin_ins=segd(rho=0.5), plugin=PLUGIN)
    with pytest.raises(ProtocolError, match=r"^the server sent a bad message: key 'arrays' is missing$"):
        FedESPlugin().train(pixel_node(), empty_context(), ins, content)


# --- NaAgg and the strategy ------------------------------------------------------------------------

def test_naagg_weights_are_size_times_rho_and_none_when_all_zero():
    assert naagg_weights([10, 30, 20], [0.5, 0.0, 1.0]) == [5.0, 0.0, 20.0]
    assert naagg_weights([10, 30], [0.0, 0.0]) is None
    assert naagg_weights([1, 1], [0.25, 0.0]) == [0.25, 0.0], "weights that sum below 1 still weigh"


def fedes(truth: GroundTruth | None = None, **kwargs) -> FedES:
    """FedES on 4 clients of 10 samples (s1 = 1 of 4 rounds, half the clients a round, P = {w}), with ``kwargs``."""
    settings = strategy_settings("fedes", **{"s1": 1, "num_rounds": 4, "fraction": 0.5, "train": TRAINING, **kwargs})
    strategy = FedES(settings, context(num_clients=4, parameter_names=("w",), truth=truth,
                                       ground_truth=truth is not None))
    strategy.bind(Federation(node_of={pid: 100 + pid for pid in range(4)}, num_examples=dict.fromkeys(range(4), 10)))
    return strategy


def replies(values: dict[int, float], sizes: dict[int, int]) -> dict[int, TrainReply]:
    return {pid: TrainReply(ArrayRecord({"w": Array(np.full((2, 2), value, np.float32))}),
                            TrainStats(sizes[pid], 0.1, 1)) for pid, value in values.items()}


def test_naagg_weighs_by_size_and_rho_and_falls_back_to_fedavg(caplog, flower_identity):
    strategy = fedes()
    strategy.rho_sent = {0: 0.5, 1: 0.0, 2: 1.0}
    list(strategy.configure_train(3, ArrayRecord({"w": Array(np.ones((2, 2), np.float32))}), ConfigRecord(), None))
    assert strategy.stage == SEGD
    out = strategy.aggregate(replies({0: 1.0, 1: 100.0, 2: 4.0}, {0: 20, 1: 10, 2: 10}))
    np.testing.assert_allclose(out["w"].numpy(), (10 * 1.0 + 10 * 4.0) / 20)  # weights 20*0.5, 0, 10*1
    strategy.rho_sent = {0: 0.0, 1: 0.0}
    with caplog.at_level(logging.WARNING):
        out = strategy.aggregate(replies({0: 1.0, 1: 4.0}, {0: 30, 1: 10}))
    np.testing.assert_allclose(out["w"].numpy(), (30 * 1.0 + 10 * 4.0) / 40)
    assert strategy.naagg_fallbacks == 1 and caplog.messages == [
        "FedES round 3: every client of the round has rho 0 (clients [0, 1]); NaAgg falls back to FedAvg"]
    strategy.aggregate(replies({0: 1.0}, {0: 30}))
    assert strategy.naagg_fallbacks == 2, "results.json counts every fallback"
    strategy = fedes(aggregation="fedavg")
    strategy.stage, strategy.rho_sent = SEGD, {0: 0.5, 1: 0.0}
    out = strategy.aggregate(replies({0: 1.0, 1: 4.0}, {0: 30, 1: 10}))
    np.testing.assert_allclose(out["w"].numpy(), (30 * 1.0 + 10 * 4.0) / 40)


def test_the_estimation_round_asks_everyone_and_segd_sends_each_client_its_rho(flower_identity):
    strategy = fedes()
    assert strategy.stage == PRETRAIN, "before its first round FedES is pre-training"
    arrays = ArrayRecord({"w": Array(np.ones((2, 2), np.float32))})
    assert [strategy.phase(r) for r in (1, 2, 3, 4)] == ["pretrain", ESTIMATE, SEGD, SEGD]
    assert len(list(strategy.configure_train(1, arrays, ConfigRecord(), None))) == 2
    assert len(list(strategy.configure_train(2, arrays, ConfigRecord(), None))) == 4
    strategy.rho_sent = {0: 0.25, 1: 0.5, 2: 0.75}  # client 3 was never estimated: rho 1 (D9)
    for message in strategy.configure_train(3, arrays, ConfigRecord(), None):
        pid = strategy.federation.partition_of(message.metadata.dst_node_id)
        assert read_instruction(message.content, TrainIns).plugin == PLUGIN
        assert read_plugin_ins(message.content, PLUGIN, SeGdIns).rho == {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0}[pid]


def test_own_upload_measures_each_update_from_the_clients_upload_before_and_static_keeps_cops(flower_identity):
    strategy = fedes(mu="arithmetic_mean", cop_origin="own_upload", mask="static")
    start = ArrayRecord({"w": Array(np.ones((2, 2), np.float32))})
    list(strategy.configure_train(1, start, ConfigRecord(), None))
    uploads = replies({0: 2.0, 1: 3.0}, {0: 10, 1: 10})
    after_one = strategy.aggregate(uploads)  # round s1 = 1: the uploads are kept for the estimation
    assert sorted(strategy.previous_uploads) == [0, 1]
    messages = list(strategy.configure_train(2, after_one, ConfigRecord(), None))
    options = [read_plugin_ins(m.content, PLUGIN, SeGdIns) for m in messages]
    assert len(options) == 4 and all(o.rho == 1.0 and o.keep_cop and o.mask == "static" for o in options)
    trained = replies({0: 2.5, 1: 4.0, 2: 3.0, 3: 3.5}, dict.fromkeys(range(4), 10))
    aggregate = strategy.aggregate(trained)
    own = {pid: fedes_quality.flat(as_arrays(reply), ["w"]) for pid, reply in uploads.items()}
    expected = estimate_quality({"w": np.full((2, 2), 2.5)}, {pid: as_arrays(r) for pid, r in trained.items()},
                                {"w": aggregate["w"].numpy()}, ["w"], estimator="arithmetic_mean", seed=1,
                                client_starts={pid: {"w": value.reshape(2, 2)} for pid, value in own.items()})
    assert strategy.estimate.distance == pytest.approx(expected.distance) and strategy.previous_uploads == {}
    sent = [read_plugin_ins(m.content, PLUGIN, SeGdIns) for m in strategy.configure_train(3, aggregate,
                                                                                          ConfigRecord(), None)]
    assert sent and all(o.mask == "static" and not o.keep_cop for o in sent)


def as_arrays(reply: TrainReply) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in reply.arrays.items()}


# Clients 0, 1 and 3 noisy; 3 will not answer the estimation round. True quality q = 1 - noise.
TRUTH = GroundTruth(noisy_clients=frozenset({0, 1, 3}), true_noise={0: 0.6, 1: 0.5, 2: 0.0, 3: 0.2},
                    sizes=dict.fromkeys(range(4), 10), known=dict.fromkeys(range(4), 10))


def estimated(strategy: FedES) -> FedES:
    """Round 2 (the estimation round, s1 = 1) from a global w of ones; clients 0, 1, 2 answer with w
    filled with 1.5, 2.5, 3.5 (10 samples each), client 3 does not. Every CoP entry is |w - 1|:
    0.5, 1.5, 2.5 and, for the average 2.5, 1.5; so with the arithmetic mean as mu, d = -1, 0, 1."""
    list(strategy.configure_train(2, ArrayRecord({"w": Array(np.ones((2, 2), np.float32))}), ConfigRecord(), None))
    strategy.aggregate(replies({0: 1.5, 1: 2.5, 2: 3.5}, dict.fromkeys(range(3), 10)))
    return strategy


class FlushedLines(io.StringIO):
    """A stdout that keeps what had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_the_estimate_with_ground_truth_is_printed_logged_and_reported(flower_identity, caplog, monkeypatch):
    """Rho = min-max of d = 0, 0.5, 1, the first raised to the floor 0.25; against q = 0.4, 0.5, 1:
    MSE 0.15^2 / 3 = 0.0075, MAE 0.05, Spearman 1. Client 1 (rho exactly 0.5) is not detected."""
    stdout = FlushedLines()
    monkeypatch.setattr(sys, "stdout", stdout)
    with caplog.at_level(logging.WARNING):
        strategy = estimated(fedes(truth=TRUTH, mu="arithmetic_mean", rho_floor=0.25))
    line = "[fedes] rho estimated at round 2: rho in [0.250, 1.000]; MSE vs true quality 0.0075\n"
    assert stdout.getvalue() == line and stdout.flushed[-1] == line, "one line, flushed at once"
    assert caplog.messages == ["FedES: clients [3] did not answer the estimation round; they train with rho = 1"]
    assert strategy.rho_sent == {0: 0.25, 1: 0.5, 2: 1.0} and strategy.rho_of(3) == 1.0
    block = strategy.result_blocks()["fedes"]
    clients = block.pop("clients")
    figures = {key: block.pop(key) for key in ("quality_mse", "quality_mae", "quality_spearman")}
    assert figures == pytest.approx({"quality_mse": 0.0075, "quality_mae": 0.05, "quality_spearman": 1.0})
    assert block.pop("detection") == pytest.approx({"precision": 1.0, "recall": 1 / 3, "f1": 0.5})
    assert block == {
        "estimated_at": 2, "estimation_rounds": [2], "mask": "dynamic", "cop_origin": "global",
        "rho_source": "estimate", "aggregation": "naagg", "naagg_fallbacks": 0, "mu_global": 1.5,
        "rho": {"0": 0.25, "1": 0.5, "2": 1.0}, "rho_sent": {"0": 0.25, "1": 0.5, "2": 1.0},
        "distance": {"0": -1.0, "1": 0.0, "2": 1.0}, "mu": {"0": 0.5, "1": 1.5, "2": 2.5},
        "true_quality": {"0": 0.4, "1": 0.5, "2": 1.0, "3": 0.8}, "detection_threshold": 0.5,
        "detected_noisy_clients": [0], "true_noisy_clients": [0, 1, 3], "detection_not_applicable": None,
    }
    assert clients == [
        {"client": 0, "distance": -1.0, "mu": 0.5, "rho": 0.25, "rho_sent": 0.25, "true_quality": 0.4},
        {"client": 1, "distance": 0.0, "mu": 1.5, "rho": 0.5, "rho_sent": 0.5, "true_quality": 0.5},
        {"client": 2, "distance": 1.0, "mu": 2.5, "rho": 1.0, "rho_sent": 1.0, "true_quality": 1.0},
        {"client": 3, "distance": None, "mu": None, "rho": None, "rho_sent": 1.0, "true_quality": 0.8},
    ], "fedes_clients.csv: every client, the one not estimated with rho 1 sent"


def test_without_ground_truth_the_estimate_has_no_quality_figures(flower_identity, capsys):
    strategy = estimated(fedes(mu="arithmetic_mean"))
    assert capsys.readouterr().out == "[fedes] rho estimated at round 2: rho in [0.000, 1.000]\n"
    assert [row["true_quality"] for row in strategy.client_rows()] == [None] * 4
    assert [row["rho"] for row in strategy.client_rows()] == [0.0, 0.5, 1.0, None]
    block = strategy.result_blocks()["fedes"]
    assert "true_quality" not in block and "quality_mse" not in block and "true_noisy_clients" not in block
    assert block["detected_noisy_clients"] == [0]


def test_the_block_before_any_estimate_has_the_switches_and_empty_estimates():
    """A run that ends before its estimation round reports FedES's switches, nothing estimated."""
    strategy = fedes(truth=TRUTH, aggregation="fedavg")
    assert strategy.client_rows() == []
    assert strategy.result_blocks() == {"fedes": {
        "estimated_at": None, "estimation_rounds": [], "mask": "dynamic", "cop_origin": "global",
        "rho_source": "estimate", "aggregation": "fedavg", "naagg_fallbacks": 0, "mu_global": None, "rho": {},
        "rho_sent": {}, "distance": {}, "mu": {}, "clients": [],
        "true_quality": {"0": 0.4, "1": 0.5, "2": 1.0, "3": 0.8},
    }}


def test_the_oracle_sends_one_minus_the_true_noise_and_one_where_it_is_unknown(flower_identity):
    truth = GroundTruth(noisy_clients=frozenset({0}), true_noise={0: 0.75, 1: 0.0, 2: 0.5, 3: float("nan")},
                        sizes=dict.fromkeys(range(4), 10), known={0: 10, 1: 10, 2: 10, 3: 0})
    strategy = estimated(fedes(truth=truth, mu="arithmetic_mean", rho_source="oracle"))
    assert strategy.rho_sent == {0: 0.25, 1: 1.0, 2: 0.5, 3: 1.0}
    assert strategy.estimate is not None and strategy.estimate.rho == {0: 0.0, 1: 0.5, 2: 1.0}, "still estimated"


def test_the_estimate_uses_the_runs_seed_for_the_gmm(flower_identity, monkeypatch):
    """Mu = gmm with a subsample of 2 (drawn from the run's seed): every CoP entry is the same here, so
    each mu is that entry, as the arithmetic mean would give."""
    monkeypatch.setattr(fedes_quality, "GMM_SAMPLE", 2)
    strategy = estimated(fedes(mu="gmm"))
    assert strategy.estimate is not None and strategy.estimate.mu == {0: 0.5, 1: 1.5, 2: 2.5}


def test_the_summary_logs_the_rounds_and_the_settings(caplog):
    strategy = fedes()
    with caplog.at_level(logging.INFO, logger="strategies.fedes"):
        strategy.summary()
    assert caplog.messages == [f"FedES: 4 rounds in all; {strategy.settings}"]


def test_the_stage_ends_are_the_last_pretraining_and_the_estimation_round():
    assert fedes().stage_ends() == [1, 2]
    assert fedes(s1=3).stage_ends() == [3], "an estimation round that is the run's last round ends no stage"


def test_the_oracle_needs_ground_truth_and_is_refused_with_the_config():
    with pytest.raises(InvalidValue, match="^rho_source='oracle' is invalid: allowed is estimate without ground "
                                           "truth: oracle reads the scene's true noise$"):
        FedES.check_run(strategy_settings("fedes", rho_source="oracle"), context(parameter_names=("w",)))
    # Checked with the rest of the config, before any scene is built: a deployed run has no truth.
    overrides = ["experiment=smoke", "strategy=fedes", "strategy.rho_source=oracle"]
    with pytest.raises(InvalidValue, match="strategy.rho_source='oracle' is invalid"):
        load_run(compose_config([*overrides, "ground_truth=false"]))
    load_run(compose_config([*overrides, "ground_truth=true"]))


# --- protocol --------------------------------------------------------------------------------------

def test_segd_options_round_trip_through_the_protocol():
    options = segd(rho=0.25, mask_params="all", strict_freeze=True)
    content = instruction(TrainIns(5, TRAINING, plugin=PLUGIN), plugin_ins=options, plugin=PLUGIN)
    assert read_plugin_ins(content, PLUGIN, SeGdIns) == options
    assert dict(content[PLUGIN]) == {"rho": 0.25, "mask-params": "all", "strict-freeze": True, "mask": "dynamic",
                                     "keep-cop": False}
    bad = RecordDict({PLUGIN: ConfigRecord({"rho": 1.5, "mask-params": "weights", "strict-freeze": False,
                                            "mask": "dynamic", "keep-cop": False})})
    with pytest.raises(ProtocolError, match="key 'rho' is invalid: allowed is a number >= 0.0 and <= 1.0"):
        read_plugin_ins(bad, PLUGIN, SeGdIns)


# --- settings --------------------------------------------------------------------------------------

SMOKE = ["experiment=smoke", "strategy=fedes"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["strategy.s1=10"], r"^strategy.s1=10 is invalid: allowed is an integer >= 0 and < num_rounds \(10\): the "
                         r"estimation round s1 \+ 1 must be one of the run's rounds$"),
    (["strategy.s1=-1"], r"^strategy.s1=-1 is invalid: allowed is an integer >= 0$"),
    (["strategy.train.learner=sce"], r"^strategy.train.learner='sce' is invalid: allowed is ce: FedES pre-trains, "
                                     r"estimates and runs SeGD with cross-entropy$"),
    (["strategy.aggregation=median"], r"^strategy.aggregation='median' is invalid: allowed are naagg, fedavg$"),
    (["strategy.rho_source=truth"], r"^strategy.rho_source='truth' is invalid"),
    (["strategy.mu=median"], r"^strategy.mu='median' is invalid: allowed are gmm, arithmetic_mean$"),
    (["strategy.rho_floor=1.5"], r"^strategy.rho_floor=1.5 is invalid"),
    (["strategy.mask_params=bias"], r"^strategy.mask_params='bias' is invalid: allowed are weights, all$"),
    (["strategy.strict_freeze=maybe"], r"^strategy.strict_freeze='maybe' is invalid: allowed is true or false$"),
    (["comm_budget=18"], r"^comm_budget=18 is invalid: too small; FedES's pre-training and estimation rounds "
                         r"alone spend 19 client participations$"),
    (["strategy.mask=random"], r"^strategy.mask='random' is invalid: allowed are dynamic, static$"),
    (["strategy.cop_origin=mine"], r"^strategy.cop_origin='mine' is invalid: allowed are global, own_upload$"),
    (["strategy.reestimate_every=1"], r"^strategy.reestimate_every=1 is invalid: allowed is"),
])
def test_bad_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as caught:
        load_run(compose_config([*SMOKE, *overrides]))
    assert "\n" not in str(caught.value)


def test_a_budget_pays_pretraining_and_estimation_first():
    def total(budget: int) -> int:
        plan = load_run(compose_config([*SMOKE, f"comm_budget={budget}"]))
        return plan.strategy.build(plan.context(parameter_names=("w",))).planned_rounds()

    # smoke: 3 of 10 clients per round; s1 = 3 rounds (9) + the estimation round (10) = 19.
    assert total(19) == 4 and total(37) == 10 and total(39) == 10


def test_reestimation_rounds_recur_and_cost_every_client():
    assert [phase_of(r, 3, None) for r in range(1, 9)] == [PRETRAIN] * 3 + [ESTIMATE] + [SEGD] * 4
    assert [phase_of(r, 3, 3) for r in range(1, 11)] == [PRETRAIN] * 3 + [ESTIMATE, SEGD, SEGD] * 2 + [ESTIMATE]

    def total(budget: int) -> int:
        plan = load_run(compose_config([*SMOKE, "strategy.reestimate_every=3", f"comm_budget={budget}"]))
        return plan.strategy.build(plan.context(parameter_names=("w",))).planned_rounds()

    # Rounds 4 (10), 5 and 6 (3 each), 7 (10), 8 (3): 19, 22, 25, 35, 38 participations.
    assert [total(b) for b in (19, 24, 25, 34, 35, 38)] == [4, 5, 6, 6, 7, 8]


# --- client and a whole run ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smoke_run(prepared_run):
    return prepared_run("experiment=smoke strategy=fedes")


@pytest.mark.parametrize(("strict_freeze", "weight_decay"), [(False, 0.0), (False, 0.1), (True, 0.1)])
def test_the_client_trains_at_rho_zero_and_returns_weights_and_stats_only(smoke_run, incoming, node_context,
                                                                            strict_freeze, weight_decay):
    overrides, _, arrays = smoke_run
    context = node_context(overrides, 3)
    options = segd(rho=0.0, strict_freeze=strict_freeze)
    content = instruction(TrainIns(1, TRAINING.but(weight_decay=weight_decay), plugin=PLUGIN), arrays=arrays,
                          plugin_ins=options, plugin=PLUGIN)
    reply = client_app.train(incoming(content, "train"), context)
    assert set(reply.content.keys()) == {"arrays", "metrics"} and not context.state.array_records
    steps = read_reply(reply.content, TrainStats, "client 3").steps
    before, after = arrays.to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
    assert all(not torch.equal(value, after[name]) for name, value in before.items() if value.ndim < 2), \
        "the biases are outside P: they train plainly"
    in_p = [name for name, value in before.items() if value.ndim >= 2]
    moved = sum(int((before[name] != after[name]).sum()) for name in in_p)
    size = sum(before[name].numel() for name in in_p)
    # At rho = 0 every gradient of P is zero (k = 1 entry is kept, at scale 0). Only weight decay
    # moves P then, every entry of it; strict_freeze holds all but the one kept entry of each step.
    if weight_decay == 0:
        assert moved == 0
    elif strict_freeze:
        assert 0 < moved <= steps
    else:
        assert moved > 0.99 * size


def test_the_static_mask_trains_only_the_top_of_the_clients_own_estimation_cop(smoke_run, incoming, node_context):
    overrides, _, arrays = smoke_run
    context = node_context(overrides, 3)

    def train(options: SeGdIns, start: ArrayRecord) -> ArrayRecord:
        content = instruction(TrainIns(1, TRAINING, plugin=PLUGIN), arrays=start, plugin_ins=options, plugin=PLUGIN)
        return client_app.train(incoming(content, "train"), context).content["arrays"]

    with pytest.raises(RuntimeError, match="client 3 has no CoP from an estimation round"):
        train(segd(rho=0.25, mask="static"), arrays)
    estimated = train(segd(rho=1.0, mask="static", keep_cop=True), arrays)
    before = {name: value.numpy() for name, value in arrays.items()}
    after = {name: value.numpy() for name, value in estimated.items()}
    names = [name for name, value in before.items() if value.ndim >= 2]
    kept = context.state.array_records["fedes-cop"]["cop"].numpy()
    np.testing.assert_allclose(kept, criticality(flat(after, names), flat(before, names)), rtol=1e-5, atol=1e-12)
    # SeGD at rho 1/4 from the estimated model: only entries among the kept CoP's top quarter move.
    masked = train(segd(rho=0.25, mask="static"), estimated)
    moved = flat({n: v.numpy() for n, v in masked.items()}, names) != flat(after, names)
    top = critical_mask(torch.from_numpy(kept), 0.25).numpy()
    assert moved.any() and not (moved & ~top).any()


def test_a_smoke_run_estimates_rho_that_ranks_clean_above_noisy(run_inprocess):
    payload, grid = run_inprocess(" ".join(SMOKE))
    rounds = payload["rounds"]
    assert [row["stage"] for row in rounds] == ["pretrain"] * 3 + ["estimate"] + ["segd"] * 6
    assert [row["comm_cost"] for row in rounds] == [3, 6, 9, 19, 22, 25, 28, 31, 34, 37]
    assert rounds[3]["clients"] == list(range(10))
    block = payload["fedes"]
    assert block["estimated_at"] == 4 and sorted(block["rho"], key=int) == [str(pid) for pid in range(10)]
    sent = [(message.metadata.dst_node_id, read_plugin_ins(message.content, PLUGIN, SeGdIns).rho)
            for message in grid.delivered if PLUGIN in message.content]
    assert len(sent) == 6 * 3
    assert all(rho == block["rho"][str(grid.node_ids.index(node))] for node, rho in sent)
    # The smoke scene (seed 1) has 5 noisy clients (true noise 0.48-0.85) and 5 clean ones. The
    # signed EMD ranks them well enough at this size: Spearman 0.89, MSE 0.027 when written.
    noisy = set(block["true_noisy_clients"])
    rho = {int(pid): value for pid, value in block["rho"].items()}
    assert np.mean([rho[k] for k in rho if k not in noisy]) > np.mean([rho[k] for k in noisy])
    assert block["quality_spearman"] > 0.5 and block["quality_mse"] < 0.1
    assert block["detection_threshold"] == 0.5 and set(block["detected_noisy_clients"]) <= noisy
    assert payload["complete"] and payload["summary"]["best_acc"] > 0.5


def test_a_smoke_run_with_reestimation_static_masks_and_own_uploads_follows_its_schedule(run_inprocess):
    # One local epoch and the plain mean as mu: the schedule does not depend on how long clients train
    # or on how each CoP vector is summarised (the GMM summary is the smoke run's above).
    payload, _ = run_inprocess(" ".join([*SMOKE, "strategy.reestimate_every=3", "strategy.mask=static",
                                         "strategy.cop_origin=own_upload", "strategy.train.epochs=1",
                                         "strategy.mu=arithmetic_mean"]))
    rounds = payload["rounds"]
    assert [row["stage"] for row in rounds] == ["pretrain"] * 3 + ["estimate", "segd", "segd"] * 2 + ["estimate"]
    assert [row["comm_cost"] for row in rounds] == [3, 6, 9, 19, 22, 25, 35, 38, 41, 51]
    block = payload["fedes"]
    assert block["estimation_rounds"] == [4, 7, 10] and block["estimated_at"] == 10
    assert block["mask"] == "static" and block["cop_origin"] == "own_upload"
    assert sorted(block["rho"], key=int) == [str(pid) for pid in range(10)] and payload["complete"]
