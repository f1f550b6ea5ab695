"""FedDiv's client helpers one at a time: which filter splits a client's samples and with which seed
(global, fixed, the code's random start, a local bootstrap), the filter's scored losses (evaluation or
augmented images, ce or softmax_ce), the mixture seeds' streams, the selection's boundaries, and the
client state's stored types and shape check."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict
from test_feddiv import client_settings
from torch import nn

import client.plugins.feddiv as feddiv_module
from client.node import LocalNode
from client.plugins.feddiv import (
    STATE_KEY,
    ClientState,
    _logits,
    _mixture_seed,
    _scored_losses,
    _splitting_filter,
    filter_losses,
    load_state,
    noise_share,
    select,
    store_state,
)
from client.state_store import load_record
from common.seeding import rng_for
from data.transforms import BatchTransform, TransformSpec
from protocol.feddiv import FedDivIns
from task.evaluation import augmented_logits
from task.noise_filter import FIXED_FILTER, NoiseFilter

RUN_SEED = 11
GLOBAL = NoiseFilter(0.1, 0.6, 0.01, 0.05, 0.7, 0.3)


@dataclass
class FakeNode:
    """The parts of a ``LocalNode`` the helpers read: its id, seed, images, transforms, device and classes;
    ``generator`` is ``LocalNode``'s own, so augmentation streams are the real ones."""

    partition_id: int = 4
    num_classes: int = 3
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        images = torch.randint(0, 256, (6, 1, 6, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        self.settings = SimpleNamespace(seed=RUN_SEED)
        self.data = SimpleNamespace(images=images)
        self.dataset = SimpleNamespace(num_classes=self.num_classes)
        spec = TransformSpec(crop=4, pad=1, flip=True)
        self.train_transform = BatchTransform(spec, [0.5], [0.5], train=True)
        self.eval_transform = BatchTransform(TransformSpec(crop=4), [0.5], [0.5], train=False)

    generator = LocalNode.generator


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def ins(filter_: NoiseFilter | None = None, **changes: Any) -> FedDivIns:
    return FedDivIns(phase="main", params=client_settings(**changes), eta=0.0, filter=filter_, seed=RUN_SEED)


def stream_seed(stream: str) -> int:
    """The documented mixture seed: 31 bits drawn from the run seed's stream ``stream``."""
    return int(rng_for(RUN_SEED, stream).integers(2**31))


class Recorder:
    """Stands in for ``fit_filter`` / ``random_filter``: records its arguments, returns a marker filter."""

    def __init__(self, result: NoiseFilter) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.result = result

    def __call__(self, *args: Any, **kwargs: Any) -> NoiseFilter:
        self.calls.append((args, kwargs))
        return self.result


FITTED = NoiseFilter(0.2, 0.9, 0.02, 0.02, 0.5, 0.5)
RANDOM = NoiseFilter(0.3, 0.7, 0.03, 0.03, 0.5, 0.5)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> tuple[Recorder, Recorder]:
    """(fit_filter, random_filter) of the plugin module replaced by recorders."""
    fit, random = Recorder(FITTED), Recorder(RANDOM)
    monkeypatch.setattr(feddiv_module, "fit_filter", fit)
    monkeypatch.setattr(feddiv_module, "random_filter", random)
    return fit, random


NORMALISED = np.array([0.0, 0.1, 0.2, 0.8, 1.0])


@pytest.mark.parametrize("scope", ["all", "round"])
@pytest.mark.parametrize("init", ["local_bootstrap", "fixed", "code_random"])
def test_a_global_filter_splits_outside_the_local_scope_whatever_the_start(spies, scope: str, init: str) -> None:
    """With a global filter and a non-local scope the split uses it as received: no fit, no stand-in."""
    fit, random = spies
    assert _splitting_filter(ins(GLOBAL, filter_scope=scope, filter_init=init), FakeNode(), 3, NORMALISED) is GLOBAL
    assert fit.calls == [] and random.calls == []


def test_the_local_scope_fits_its_own_filter_every_round_even_with_a_global_one(spies) -> None:
    """Table 5's local scope ignores the global filter: a fresh bootstrap mixture, seeded per client and round."""
    fit, random = spies
    result = _splitting_filter(ins(GLOBAL, filter_scope="local", filter_init="fixed"), FakeNode(4), 3, NORMALISED)
    assert result is FITTED and random.calls == []
    (args, kwargs), = fit.calls
    assert args[0] is NORMALISED and kwargs == {}
    assert args[1] == stream_seed("feddiv-bootstrap/3/4")


def test_the_fixed_start_stands_in_before_any_global_filter(spies) -> None:
    fit, random = spies
    assert _splitting_filter(ins(None, filter_init="fixed"), FakeNode(), 3, NORMALISED) == FIXED_FILTER
    assert fit.calls == [] and random.calls == []


def test_the_codes_random_start_is_seeded_by_run_and_round_and_is_one_filter_for_every_client(spies) -> None:
    """code_random: random_filter with the seed of stream ``feddiv-random/<round>`` (no client in it)."""
    fit, random = spies
    for pid in (0, 4):
        assert _splitting_filter(ins(None, filter_init="code_random"), FakeNode(pid), 3, NORMALISED) is RANDOM
    assert fit.calls == []
    assert [call[0] for call in random.calls] == [(stream_seed("feddiv-random/3"),)] * 2


def test_the_local_bootstrap_start_fits_the_clients_losses_with_its_own_seed(spies) -> None:
    """local_bootstrap without a global filter: EM on the client's losses, seed stream per round and client."""
    fit, random = spies
    for pid in (0, 4):
        assert _splitting_filter(ins(None, filter_init="local_bootstrap"), FakeNode(pid), 7, NORMALISED) is FITTED
    assert random.calls == []
    assert [call[0][1] for call in fit.calls] == [stream_seed("feddiv-bootstrap/7/0"),
                                                   stream_seed("feddiv-bootstrap/7/4")]
    assert len({call[0][1] for call in fit.calls}) == 2, "clients get different seeds"


def test_the_mixture_seeds_follow_their_streams_and_fit_in_31_bits() -> None:
    """A client's seed names purpose, round and client; the shared one only purpose and round. Over 40
    rounds some 31-bit seed is above 2**30 (a narrower draw is caught), none at or above 2**31."""
    options = ins()
    seeds = [_mixture_seed(options, FakeNode(2), r, "filter") for r in range(40)]
    assert seeds == [stream_seed(f"feddiv-filter/{r}/2") for r in range(40)]
    shared = [_mixture_seed(options, None, r, "random") for r in range(40)]
    assert shared == [stream_seed(f"feddiv-random/{r}") for r in range(40)]
    assert all(0 <= s < 2**31 for s in seeds + shared) and max(seeds) >= 2**30
    assert _mixture_seed(options, FakeNode(1), 5, "filter") != _mixture_seed(options, FakeNode(2), 5, "filter")


def test_evaluation_scoring_uses_the_given_logits_and_the_chosen_loss() -> None:
    """filter_transform=eval: the losses of the logits already computed (the model is not run again)."""
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0], [0.0, 4.0, 0.0],
                           [0.5, 0.0, 0.0]])
    labels = np.array([0, 0, 2, 1, 1, 0])
    node = FakeNode()
    for loss in ("ce", "softmax_ce"):
        params = client_settings(filter_transform="eval", filter_loss=loss)
        got = _scored_losses(tiny_model(), logits, node, labels, params, 3, "global")
        np.testing.assert_array_equal(got, filter_losses(logits, labels, loss))
    # The bounded loss differs from plain CE on these logits, so the choice is visible.
    assert not np.allclose(filter_losses(logits, labels, "ce"), filter_losses(logits, labels, "softmax_ce"))


def test_training_transform_scoring_augments_with_the_rounds_purpose_stream() -> None:
    """filter_transform=train: losses of the model on augmented images drawn from the node's generator for
    (round, ``feddiv-<purpose>``), so global and local scoring, and rounds, draw different augmentations."""
    node, model = FakeNode(), tiny_model()
    labels = np.array([0, 1, 2, 0, 1, 2])
    given = torch.zeros(6, 3)  # not used when scoring on augmented images
    params = client_settings(filter_transform="train", filter_loss="softmax_ce")

    def expected(server_round: int, purpose: str) -> np.ndarray:
        logits = augmented_logits(model, node.data.images, node.train_transform,
                                  node.generator(server_round, f"feddiv-{purpose}"))
        return filter_losses(logits, labels, "softmax_ce")

    got = _scored_losses(model, given, node, labels, params, 3, "global")
    np.testing.assert_allclose(got, expected(3, "global"), rtol=1e-6)
    assert np.ptp(got) > 0, "the given zero logits would give all-equal losses"
    assert not np.allclose(expected(3, "global"), expected(3, "local"))
    assert not np.allclose(expected(3, "global"), expected(4, "global"))
    assert not np.allclose(expected(3, "global"), expected(3, "train"))
    np.testing.assert_allclose(_scored_losses(model, given, node, labels, params, 4, "local"), expected(4, "local"),
                               rtol=1e-6)


def test_scoring_and_prediction_run_on_the_nodes_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU node must evaluate on its GPU: both the evaluation and the augmented pass get ``node.device``."""
    devices: list[Any] = []

    def recorded(real):
        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            devices.append(kwargs.get("device"))
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(feddiv_module, "predict_logits", recorded(feddiv_module.predict_logits))
    monkeypatch.setattr(feddiv_module, "augmented_logits", recorded(feddiv_module.augmented_logits))
    node, model = FakeNode(device=torch.device("cpu", 0)), tiny_model()
    logits = _logits(model, node)
    assert logits.shape == (6, 3)
    _scored_losses(model, logits, node, np.zeros(6, dtype=np.int64), client_settings(filter_transform="train"), 1,
                   "local")
    assert devices == [node.device, node.device]


def context() -> Context:
    return Context(run_id=1, node_id=77, node_config={"partition-id": 4}, state=RecordDict(), run_config={})


def test_the_state_is_kept_in_its_documented_types_whatever_it_was_given() -> None:
    """The prior is stored as float64 and the counts and labels as int64 (what a restarted node reads back),
    even from narrower arrays."""
    ctx, node = context(), FakeNode()
    prior = np.array([0.25, 0.5, 0.25], dtype=np.float32)
    store_state(ctx, node, ClientState(prior, np.int32(3), np.array([2, 0, 1], dtype=np.int32)))
    record = load_record(ctx, STATE_KEY, node.partition_id)
    assert record["prior"].numpy().dtype == np.float64
    assert record["participations"].numpy().dtype == np.int64
    assert record["debiased"].numpy().dtype == np.int64
    state = load_state(ctx, node)
    assert state.prior.dtype == np.float64 and state.debiased.dtype == np.int64
    np.testing.assert_array_equal(state.prior, [0.25, 0.5, 0.25])
    np.testing.assert_array_equal(state.debiased, [2, 0, 1])
    assert state.participations == 3


def test_a_kept_prior_of_another_class_count_is_one_clear_error() -> None:
    ctx = context()
    ctx.state[STATE_KEY] = ArrayRecord({"prior": Array(np.full(10, 0.1)), "participations": Array(np.array([2]))})
    with pytest.raises(RuntimeError, match=r"client state holds a FedDiv prior of shape \(10,\); the run has 3 "
                                           r"classes"):
        load_state(ctx, FakeNode(num_classes=3))


LABELS = np.array([0, 1, 2, 0])
PROBS = np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.25, 0.5, 0.25], [0.4, 0.3, 0.3]])


def test_a_client_exactly_at_the_clean_bar_is_noisy() -> None:
    """delta_hat = 1/4 with clean_client = 0.25 (both exact): not below the bar, so the noisy rules apply."""
    params = replace(client_settings(clean_client=0.25), zeta=0.9)
    chosen = select(params, LABELS, np.array([True, True, False, True]), PROBS, 0)
    np.testing.assert_array_equal(chosen.candidates, [0, 1, 3])
    assert chosen.sampler is True


def test_a_client_with_exactly_the_bars_share_of_noisy_samples_is_noisy() -> None:
    """1 noisy sample in 10 is delta_hat = 0.1 exactly, not below the default 0.1 bar: the noisy rules
    apply (1 - 0.9 in floats would be 0.09999999999999998 and take the client for clean)."""
    clean = np.array([True] * 9 + [False])
    assert noise_share(clean) == 0.1
    chosen = select(client_settings(), np.zeros(10, dtype=int), clean, np.full((10, 2), 0.5), 0)
    assert chosen.sampler is True and 9 not in chosen.candidates


def test_a_clean_clients_selection_relabels_nothing() -> None:
    """Below the bar: every row, no sampler, and a relabel mask of all False (the report sums it)."""
    chosen = select(client_settings(clean_client=0.5), LABELS, np.array([True, True, False, True]), PROBS, 0)
    np.testing.assert_array_equal(chosen.candidates, [0, 1, 2, 3])
    assert chosen.relabeled.dtype == np.bool_ and chosen.relabeled.shape == (4,) and not chosen.relabeled.any()
    assert chosen.sampler is False


def test_a_noisy_sample_exactly_at_zeta_is_relabelled() -> None:
    """Eq. 11's confidence test is max-probability >= zeta: 0.5 at zeta 0.5 relabels, 0.4 does not."""
    params = client_settings(clean_client=0.1, zeta=0.5)
    chosen = select(params, LABELS, np.array([True, True, False, False]), PROBS, 0)
    np.testing.assert_array_equal(np.flatnonzero(chosen.relabeled), [2])
    np.testing.assert_array_equal(chosen.train_labels, [0, 1, 1, 0])
    np.testing.assert_array_equal(chosen.candidates, [0, 1, 2])
