"""Local training and evaluation: learning, proximal pull, mixup, determinism, metrics, bad input."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from defaults import composed, local_training
from pixels import RAW, pixel_model
from torch import nn

from client.plugins.feddyn import LinearTerm
from common.errors import ConfigError
from common.validation import from_mapping
from data.client_data import IndexedImages
from data.transforms import BatchTransform, TransformSpec
from models import build_model
from task.evaluation import (
    augmented_logits,
    evaluate,
    evaluate_by_class,
    loss_and_proba,
    predict_logits,
    predict_proba,
)
from task.hooks import TrainingHooks
from task.learner_settings import LearnerSchedule
from task.local_training import LocalTraining, TrainStats
from task.training import train_local

N_TRAIN = 300
FAST = local_training(lr=0.05, epochs=3)


@pytest.fixture(scope="module")
def local(digits):
    """A small local training set, the test split, and train/eval transforms for digits."""
    eval_tf = BatchTransform(TransformSpec(), digits.mean, digits.std, train=False)
    train_tf = BatchTransform(TransformSpec(), digits.mean, digits.std, train=True)
    train = (digits.train.images[:N_TRAIN], digits.train.labels[:N_TRAIN])
    test = (digits.test.images, digits.test.labels)
    return train, test, train_tf, eval_tf


def _shifting(digits) -> BatchTransform:
    """A random shift of up to one pixel: augmentation that must draw from the generator."""
    return BatchTransform(TransformSpec(crop=8, pad=1), digits.mean, digits.std, train=True)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("small_cnn", num_classes=10, in_channels=1, image_size=8)


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _train(local, cfg: LocalTraining = FAST, seed: int = 0, hooks: TrainingHooks | None = None
           ) -> tuple[nn.Module, TrainStats]:
    (images, labels), _, train_tf, _ = local
    model = _model()
    metrics = train_local(model, images, labels, train_tf, hooks or TrainingHooks(cfg), generator=_gen(seed))
    return model, metrics


def test_training_lowers_test_loss_and_raises_accuracy(local) -> None:
    (images, labels), (test_x, test_y), train_tf, eval_tf = local
    model = _model()
    before = evaluate(model, test_x, test_y, eval_tf)
    metrics = train_local(model, images, labels, train_tf, TrainingHooks(FAST), generator=_gen(0))
    after = evaluate(model, test_x, test_y, eval_tf)
    assert before.accuracy < 0.3 and after.accuracy > 0.7
    assert after.loss < 0.5 * before.loss
    assert metrics.train_loss < before.loss
    assert metrics.num_examples == N_TRAIN
    assert metrics.steps == FAST.epochs * math.ceil(N_TRAIN / FAST.batch_size)
    assert model.training  # the mode it came in


def test_last_partial_batch_is_kept_and_a_single_image_batch_skipped_only_with_batchnorm(local) -> None:
    (images, labels), _, train_tf, _ = local
    cfg = local_training(lr=0.01, epochs=2, batch_size=10)
    # 21 images: batches of 10, 10 and 1.
    plain = train_local(_model(), images[:21], labels[:21], train_tf, TrainingHooks(cfg), generator=_gen(0))
    with_bn = train_local(_bn_model(), images[:21], labels[:21], train_tf, TrainingHooks(cfg), generator=_gen(0))
    assert plain.steps == 2 * 3
    assert with_bn.steps == 2 * 2
    alone = train_local(_bn_model(), images[:1], labels[:1], train_tf, TrainingHooks(cfg), generator=_gen(0))
    assert alone.steps == 0 and math.isnan(alone.train_loss)
    with pytest.raises(ConfigError, match="batch_size=1 .*BatchNorm"):
        one_by_one = local_training(lr=0.01, batch_size=1)
        train_local(_bn_model(), images, labels, train_tf, TrainingHooks(one_by_one), generator=_gen(0))


@pytest.mark.parametrize("norm", ["squared", "l2"])
def test_proximal_term_keeps_weights_near_the_starting_global_model(local, norm: str) -> None:
    start = _flat(_model())
    free, _ = _train(local, local_training(lr=0.05, epochs=3, prox_norm=norm))
    pulled, metrics = _train(local, local_training(lr=0.05, epochs=3, prox_weight=2.0, prox_norm=norm))
    free_distance = float(torch.linalg.vector_norm(_flat(free) - start))
    pulled_distance = float(torch.linalg.vector_norm(_flat(pulled) - start))
    assert free_distance > 1.0
    assert pulled_distance < 0.1 * free_distance
    assert math.isfinite(metrics.train_loss)


@pytest.mark.parametrize(
    ("norm", "pull"), [("squared", lambda d: 2 * d), ("l2", lambda d: d / torch.linalg.vector_norm(d))]
)
def test_two_steps_follow_cross_entropy_plus_the_weighted_proximal_gradient(norm: str, pull) -> None:
    # Step 1 starts at the anchor (the proximal gradient is 0 there); step 2 feels the pull back.
    pixels = np.array([[10, 0], [0, 10], [5, 6], [7, 3]], dtype=np.uint8)
    labels = np.array([0, 1, 0, 0])
    x, y = torch.from_numpy(pixels).float(), torch.from_numpy(labels)
    lr, weight = 0.1, 3.0
    reference = pixel_model()
    start = _flat(reference).clone()
    params = list(reference.parameters())
    for step in range(2):
        ce = F.cross_entropy(reference(x), y)
        grad = torch.cat([g.flatten() for g in torch.autograd.grad(ce, params)])
        if step:
            grad = grad + weight * pull(_flat(reference) - start)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(_flat(reference) - lr * grad, params)

    cfg = local_training(lr=lr, momentum=0.0, epochs=2, batch_size=4, prox_weight=weight, prox_norm=norm)
    model = pixel_model()
    model.eval()
    train_local(model, pixels.reshape(4, 1, 1, 2), labels, BatchTransform(TransformSpec(), *RAW, train=True),
                TrainingHooks(cfg), generator=_gen(0))
    torch.testing.assert_close(_flat(model), _flat(reference))
    assert not model.training  # the mode it came in


def test_adams_first_step_moves_every_weight_by_the_learning_rate_against_its_gradient() -> None:
    pixels = np.array([[10, 0], [0, 10], [5, 6], [7, 3]], dtype=np.uint8)
    labels = np.array([0, 1, 0, 0])
    model = pixel_model()
    start = _flat(model).clone()
    ce = F.cross_entropy(model(torch.from_numpy(pixels).float()), torch.from_numpy(labels))
    grad = torch.cat([g.flatten() for g in torch.autograd.grad(ce, list(model.parameters()))])
    # Adam's bias-corrected first step is lr * g / (|g| + eps): lr against the gradient's sign.
    cfg = local_training(lr=0.01, optimizer="adam", epochs=1, batch_size=4)
    train_local(model, pixels.reshape(4, 1, 1, 2), labels, BatchTransform(TransformSpec(), *RAW, train=True),
                TrainingHooks(cfg), generator=_gen(0))
    moved = grad.abs() > 1e-3
    torch.testing.assert_close((_flat(model) - start)[moved], -0.01 * grad.sign()[moved], rtol=1e-3, atol=1e-6)
    with pytest.raises(ConfigError, match="optimizer='rmsprop' is invalid: allowed are sgd, adam"):
        local_training(lr=0.01, optimizer="rmsprop")


class _PullTowards(TrainingHooks):
    """A method's own loss term: 5 ||w - target||^2, after the settings' proximal term."""

    def __init__(self, training: LocalTraining, target: nn.Module) -> None:
        super().__init__(training)
        self.target = [p.detach().clone() for p in target.parameters()]

    def extra_losses(self, params):
        yield from super().extra_losses(params)
        yield 5.0 * sum(torch.sum((p - t) ** 2) for p, t in zip(params, self.target))


def test_a_method_adds_its_own_loss_term_through_the_hooks(local) -> None:
    target = _model(seed=1)
    cfg = local_training(lr=0.05, epochs=3)
    model, _ = _train(local, cfg, hooks=_PullTowards(cfg, target))
    to_target = torch.linalg.vector_norm(_flat(model) - _flat(target))
    to_start = torch.linalg.vector_norm(_flat(model) - _flat(_model()))
    assert to_target < 0.5 * to_start


class _Recording(TrainingHooks):
    """Records when each hook runs and trains epoch 1 on the first 50 rows only."""

    def __init__(self, training: LocalTraining) -> None:
        super().__init__(training)
        self.calls: list[str] = []

    def on_train_start(self, model):
        super().on_train_start(model)
        self.calls.append("start")

    def epoch_rows(self, epoch, model):
        self.calls.append(f"rows {epoch}")
        return torch.arange(50) if epoch == 1 else None

    def after_backward(self, model):
        assert all(p.grad is not None for p in model.parameters())
        self.calls.append("backward")

    def after_step(self, model):
        self.calls.append("step")


def test_the_loop_calls_each_hook_at_its_point(local) -> None:
    cfg = local_training(lr=0.05, epochs=2, batch_size=100)
    hooks = _Recording(cfg)
    _, stats = _train(local, cfg, hooks=hooks)
    # 300 rows: 3 steps in epoch 0; epoch 1 trains on 50 rows, one step.
    assert stats.steps == 4
    assert hooks.calls == ["start", "rows 0", *["backward", "step"] * 3, "rows 1", "backward", "step"]


def test_mixup_changes_training(local) -> None:
    plain, plain_metrics = _train(local, local_training(lr=0.05, epochs=1))
    mixed, mixed_metrics = _train(local, local_training(lr=0.05, epochs=1, learner="mixup"))
    assert not torch.equal(_flat(plain), _flat(mixed))
    # Mixed targets are harder to fit: the training loss stays higher.
    assert mixed_metrics.train_loss > plain_metrics.train_loss


def test_mixup_pairs_each_image_with_its_own_label(local) -> None:
    # Beta(a, a) with a tiny a puts lambda at ~0 or ~1: each step then trains on a permutation of the
    # batch (the partner images, or the images themselves) with its labels, and with full-batch steps
    # that is plain training. A loss using the wrong labels for either case would differ.
    (images, labels), _, train_tf, _ = local
    plain, mixed = _model(), _model()
    cfg = local_training(lr=0.05, epochs=8, batch_size=100)
    train_local(plain, images[:100], labels[:100], train_tf, TrainingHooks(cfg), generator=_gen(0))
    mixup = local_training(lr=0.05, epochs=8, batch_size=100, learner="mixup", mixup_alpha=1e-3)
    train_local(mixed, images[:100], labels[:100], train_tf, TrainingHooks(mixup), generator=_gen(0))
    torch.testing.assert_close(_flat(mixed), _flat(plain), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("learner", ["ce", "mixup", "sce", "lsr"])
def test_every_random_choice_comes_from_the_generator(local, digits, learner: str) -> None:
    (images, labels), _, _, _ = local
    cfg = local_training(lr=0.05, epochs=1, learner=learner)
    runs = []
    for global_seed, seed in [(1, 7), (2, 7), (1, 8)]:
        model = _model()
        # Different global torch/NumPy states must not matter: only the generator does.
        torch.manual_seed(global_seed)
        np.random.seed(global_seed)
        train_local(model, images, labels, _shifting(digits), TrainingHooks(cfg), generator=_gen(seed))
        runs.append(_flat(model))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_lazy_images_give_the_same_results_as_an_array(local, digits) -> None:
    # Arrays are copied to the device once; lazy ones (Clothing1M) are read batch by batch.
    (images, labels), (test_x, test_y), _, eval_tf = local
    lazy = IndexedImages(np.asarray(images), np.arange(N_TRAIN))
    cfg = local_training(lr=0.05, epochs=1, learner="mixup")
    array_model, lazy_model = _model(), _model()
    train_local(array_model, images, labels, _shifting(digits), TrainingHooks(cfg), generator=_gen(3))
    train_local(lazy_model, lazy, labels, _shifting(digits), TrainingHooks(cfg), generator=_gen(3))
    assert torch.equal(_flat(array_model), _flat(lazy_model))
    lazy_test = IndexedImages(np.asarray(test_x), np.arange(len(test_y)))
    from_array = evaluate(array_model, test_x, test_y, eval_tf)
    from_lazy = evaluate(array_model, lazy_test, test_y, eval_tf)
    assert asdict(from_lazy) == pytest.approx(asdict(from_array), rel=1e-6)


def test_evaluation_metrics_on_a_hand_checkable_case() -> None:
    pixels = np.array([[10, 0], [0, 10], [5, 6], [7, 3]], dtype=np.uint8)
    images = pixels.reshape(4, 1, 1, 2)
    labels = np.array([0, 1, 0, 0])  # argmax is 0, 1, 1, 0: three right
    transform = BatchTransform(TransformSpec(), *RAW, train=False)
    model = pixel_model()
    logits = pixels.astype(np.float64)
    expected_loss = np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(4), labels]

    proba = predict_proba(model, images, transform, batch_size=3)
    np.testing.assert_allclose(proba, np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True), rtol=1e-5)
    losses, _ = loss_and_proba(model, images, labels, transform, batch_size=3)
    np.testing.assert_allclose(losses, expected_loss, atol=1e-5)
    metrics = evaluate(model, images, labels, transform, batch_size=3)
    assert metrics.accuracy == pytest.approx(0.75)
    assert metrics.loss == pytest.approx(expected_loss.mean(), abs=1e-5)
    assert metrics.num_examples == 4
    by_class, confusion = evaluate_by_class(model, images, labels, transform, batch_size=3)
    assert by_class == metrics
    # rows: true class 0 (samples 0, 2, 3 predicted 0, 1, 0), true class 1 (sample 1 predicted 1)
    np.testing.assert_array_equal(confusion, [[2, 1], [0, 1]])


def test_evaluation_on_real_data_is_consistent_and_batch_size_free(local) -> None:
    _, (test_x, test_y), _, eval_tf = local
    model = _model()
    model.train()  # evaluation must switch to eval mode itself and restore this one
    proba = predict_proba(model, test_x, eval_tf, batch_size=64)
    losses, _ = loss_and_proba(model, test_x, test_y, eval_tf, batch_size=64)
    metrics = evaluate(model, test_x, test_y, eval_tf, batch_size=100)  # 360 = 3 x 100 + a partial 60
    assert proba.shape == (len(test_y), 10) and losses.shape == (len(test_y),)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)
    assert metrics.loss == pytest.approx(float(losses.mean(dtype=np.float64)), rel=1e-6)
    assert metrics.accuracy == pytest.approx(float((proba.argmax(axis=1) == test_y).mean()))
    assert metrics.num_examples == len(test_y)
    assert model.training


def test_batchnorm_model_evaluates_in_eval_mode(local) -> None:
    # In train mode a batch of one would fail in BatchNorm1d, and outputs would depend on the batch.
    _, (test_x, _), _, eval_tf = local
    model = _bn_model()
    np.testing.assert_allclose(
        predict_proba(model, test_x, eval_tf, batch_size=1), predict_proba(model, test_x, eval_tf), atol=1e-6
    )


def test_evaluation_rejects_a_training_transform_and_bad_labels(local) -> None:
    _, (test_x, test_y), train_tf, eval_tf = local
    with pytest.raises(ConfigError, match="train=False"):
        evaluate(_model(), test_x, test_y, train_tf)
    with pytest.raises(ConfigError, match=r"shape \(359,\)"):
        evaluate(_model(), test_x, test_y[:-1], eval_tf)
    with pytest.raises(ConfigError, match="label 10 .* 10 outputs"):
        loss_and_proba(_model(), test_x, np.full(len(test_y), 10), eval_tf)
    with pytest.raises(ConfigError, match="batch_size=0"):
        predict_proba(_model(), test_x, eval_tf, batch_size=0)


def test_augmented_scoring_draws_from_its_generator_and_needs_a_training_transform(local, digits) -> None:
    _, (test_x, _), _, eval_tf = local
    shifting, model = _shifting(digits), _bn_model()
    first = augmented_logits(model, test_x, shifting, _gen(1))
    assert torch.equal(first, augmented_logits(model, test_x, shifting, _gen(1)))
    assert not torch.equal(first, augmented_logits(model, test_x, shifting, _gen(2)))
    assert not torch.allclose(first, predict_logits(model, test_x, eval_tf), atol=1e-3)
    assert model.training  # scored in eval mode, left as it came
    with pytest.raises(ConfigError, match="train=True"):
        augmented_logits(model, test_x, eval_tf, _gen(1))


def test_training_rejects_bad_labels_before_changing_the_model(local) -> None:
    (images, labels), _, train_tf, _ = local
    bad_cases = [(labels[:-1], r"shape \(299,\)"), (labels - 1, "label -1"), (labels + 1, "label 10 ")]
    for bad, message in bad_cases:
        model = _model()
        before = _flat(model)
        with pytest.raises(ConfigError, match=message):
            train_local(model, images, bad, train_tf, TrainingHooks(FAST), generator=_gen(0))
        assert torch.equal(_flat(model), before)


def test_local_training_from_a_config_mapping_accepts_the_fields() -> None:
    mapping = {"lr": 0.01, "epochs": 2, "mixup_alpha": 1, "prox_norm": "l2"}
    cfg = from_mapping(LocalTraining, {**composed("strategy=fedavg")["strategy"]["train"], **mapping}, "strategy.train")
    assert cfg == local_training(lr=0.01, epochs=2, mixup_alpha=1, prox_norm="l2")
    assert (cfg.momentum, cfg.weight_decay, cfg.batch_size, cfg.prox_weight) == (0.5, 0.0, 10, 0.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", 0.0),
        ("lr", -1),
        ("lr", math.inf),
        ("lr", "0.1"),
        ("lr", True),
        ("momentum", 1.0),
        ("momentum", -0.1),
        ("weight_decay", -1e-4),
        ("epochs", 0),
        ("epochs", 1.5),
        ("batch_size", 0),
        ("mixup_alpha", -1.0),
        ("prox_weight", math.nan),
        ("prox_weight", -0.5),
        ("prox_norm", "l1"),
    ],
)
def test_local_training_rejects_each_bad_value_naming_it(key: str, value) -> None:
    mapping = {"lr": 0.01, key: value}
    with pytest.raises(ConfigError, match=f"^{key}={value!r} is invalid: allowed"):
        local_training(**mapping)
    # From the config, the value is named by its full key.
    with pytest.raises(ConfigError, match=f"^strategy.train.{key}={value!r} is invalid: allowed"):
        from_mapping(LocalTraining, {**composed("strategy=fedavg")["strategy"]["train"], **mapping}, "strategy.train")


def test_local_training_from_a_config_mapping_rejects_unknown_and_missing_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown keys \['decay', 'lrr'\].*allowed are \['lr'"):
        from_mapping(LocalTraining, {"lr": 0.01, "lrr": 0.1, "decay": 0.0}, "strategy.train")
    with pytest.raises(ConfigError, match=r"^strategy.train.lr=<unset> is invalid: the config must set it$"):
        from_mapping(LocalTraining, {"epochs": 2}, "strategy.train")
    with pytest.raises(ConfigError, match="allowed is a mapping"):
        from_mapping(LocalTraining, [("lr", 0.01)], "strategy.train")


def test_loss_and_proba_agree_with_predict_proba_and_cross_entropy(local) -> None:
    _, (test_x, test_y), _, eval_tf = local
    model = _model()
    losses, proba = loss_and_proba(model, test_x, test_y, eval_tf, batch_size=64)
    np.testing.assert_allclose(proba, predict_proba(model, test_x, eval_tf), atol=1e-6)
    np.testing.assert_allclose(losses, -np.log(proba[np.arange(len(test_y)), test_y]), rtol=1e-4)


def test_feddyn_linear_term_shifts_one_step_by_lr_times_the_correction() -> None:
    """d/dw of -<g, w> is -g: one plain SGD step moves w by lr * g more than without the term."""
    pixels = np.array([[10, 0], [0, 10], [5, 6], [7, 3]], dtype=np.uint8)
    labels = np.array([0, 1, 0, 0])
    transform = BatchTransform(TransformSpec(), *RAW, train=True)
    cfg = local_training(lr=0.1, momentum=0.0, epochs=1, batch_size=4, prox_weight=0.5)
    results = []
    for scale in (0.0, 1.0):
        model = pixel_model()
        correction = [scale * torch.full_like(p, 0.25) + scale * torch.arange(p.numel()).reshape(p.shape)
                      for p in model.parameters()]
        train_local(model, pixels.reshape(4, 1, 1, 2), labels, transform,
                    LinearTerm(cfg, LearnerSchedule(), correction), generator=_gen(0))
        results.append((_flat(model), torch.cat([g.flatten() for g in correction])))
    (plain, _), (corrected, g) = results
    torch.testing.assert_close(corrected - plain, cfg.lr * g)


def test_feddyn_linear_terms_must_match_the_parameters() -> None:
    model = pixel_model()
    before = _flat(model).clone()
    cfg = local_training(lr=0.1, epochs=1)
    transform = BatchTransform(TransformSpec(), *RAW, train=True)
    images, labels = np.zeros((2, 1, 1, 2), np.uint8), np.array([0, 1])
    with pytest.raises(RuntimeError, match="does not match the model's parameters"):
        train_local(model, images, labels, transform, LinearTerm(cfg, LearnerSchedule(), [torch.zeros(1)]),
                    generator=_gen(0))
    assert torch.equal(_flat(model), before)
