"""Batched augmentation: shapes, normalisation maths, crop/flip geometry, randomness, bad specs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF

from common.errors import ConfigError, InvalidValue
from common.validation import from_mapping
from data.transforms import BatchTransform, TransformPair, TransformSpec

CIFAR_TRAIN = TransformSpec(crop=32, pad=4, flip=True)
CLOTHING_TRAIN = TransformSpec(resize=256, crop=224, flip=True)
CLOTHING_EVAL = TransformSpec(resize=256, crop=224)
MEAN3 = (0.4914, 0.4822, 0.4465)
STD3 = (0.2470, 0.2435, 0.2616)
# With mean 0 and std 1/255 the output is the raw pixel value, so geometry can be read off exactly.
RAW_MEAN = (0.0, 0.0, 0.0)
RAW_STD = (1 / 255, 1 / 255, 1 / 255)
Window = tuple[int, int, bool]  # (top, left, flipped) in the padded image


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unique_images(batch: int, size: int, seed: int) -> torch.Tensor:
    """(batch, 3, size, size) uint8 images whose pixels are a permutation of 1..3*size*size (0 = padding)."""
    pixels = 3 * size * size
    assert pixels <= 255
    g = _seeded(seed)
    perms = torch.stack([torch.randperm(pixels, generator=g) + 1 for _ in range(batch)])
    return perms.to(torch.uint8).view(batch, 3, size, size)


def _raw(
    transform: BatchTransform, images: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The transform's output as integers; exact when it was built with RAW_MEAN/RAW_STD."""
    return transform(images, generator).round().to(torch.int64)


@pytest.mark.parametrize(
    ("spec", "train", "in_size", "out_size"),
    [
        (CIFAR_TRAIN, True, 32, 32),
        (TransformSpec(), False, 32, 32),
        (CLOTHING_TRAIN, True, 300, 224),
        (CLOTHING_EVAL, False, 256, 224),
        (TransformSpec(crop=24), True, 28, 24),
    ],
)
def test_output_shape_and_dtype(spec: TransformSpec, train: bool, in_size: int, out_size: int) -> None:
    images = torch.randint(0, 256, (5, 3, in_size, in_size), dtype=torch.uint8, generator=_seeded(0))
    out = BatchTransform(spec, MEAN3, STD3, train=train)(images, _seeded(1))
    assert out.dtype == torch.float32
    assert out.shape == (5, 3, out_size, out_size)


def test_normalisation_of_a_constant_image() -> None:
    values = torch.tensor([0, 128, 255], dtype=torch.uint8)
    images = values.view(1, 3, 1, 1).expand(2, 3, 8, 8).contiguous()
    before = images.clone()
    out = BatchTransform(TransformSpec(crop=8, pad=4, flip=True), MEAN3, STD3, train=False)(images)
    mean, std = torch.tensor(MEAN3, dtype=torch.float64), torch.tensor(STD3, dtype=torch.float64)
    expected = (values.double() / 255 - mean) / std
    torch.testing.assert_close(out, expected.float().view(1, 3, 1, 1).expand(2, 3, 8, 8), atol=1e-5, rtol=0)
    assert torch.equal(images, before), "the caller's batch must not be modified"


@pytest.mark.parametrize(("size", "crop", "top"), [(8, 4, 2), (9, 4, 2), (9, 9, 0)])
def test_eval_centre_crop_is_deterministic_and_centred(size: int, crop: int, top: int) -> None:
    images = _unique_images(3, size, seed=0)
    # pad and flip belong to training; evaluation must ignore them.
    transform = BatchTransform(TransformSpec(crop=crop, pad=2, flip=True), RAW_MEAN, RAW_STD, train=False)
    first = _raw(transform, images, _seeded(1))
    assert torch.equal(first, _raw(transform, images, _seeded(2)))
    assert torch.equal(first, images[..., top : top + crop, top : top + crop].long())


def _all_windows(image: torch.Tensor, crop: int, pad: int) -> tuple[torch.Tensor, list[Window]]:
    """Every (row, col, flipped) window of the zero-padded image, built one by one as the reference."""
    padded = np.pad(image.numpy(), ((0, 0), (pad, pad), (pad, pad)))
    windows, keys = [], []
    for row in range(padded.shape[1] - crop + 1):
        for col in range(padded.shape[2] - crop + 1):
            window = padded[:, row : row + crop, col : col + crop]
            for flipped in (False, True):
                windows.append(window[:, :, ::-1] if flipped else window)
                keys.append((row, col, flipped))
    return torch.from_numpy(np.stack(windows).astype(np.int64)), keys


def test_train_crops_are_windows_of_the_padded_image_with_every_offset_and_flip() -> None:
    size, crop, pad, batch = 8, 8, 2, 1500
    images = _unique_images(batch, size, seed=0)
    transform = BatchTransform(TransformSpec(crop=crop, pad=pad, flip=True), RAW_MEAN, RAW_STD, train=True)
    out = _raw(transform, images, _seeded(3))
    seen: Counter[Window] = Counter()
    for image, result in zip(images, out):
        windows, keys = _all_windows(image, crop, pad)
        # Each sample's output must be exactly one window of its own padded image.
        matches = (windows == result).flatten(1).all(1).nonzero().flatten().tolist()
        assert len(matches) == 1
        seen[keys[matches[0]]] += 1
    positions = (size + 2 * pad - crop + 1) ** 2
    assert len(seen) == positions * 2, "every offset must occur, flipped and not"
    flipped = sum(count for (_, _, flip), count in seen.items() if flip)
    assert abs(flipped / batch - 0.5) < 0.05
    expected = batch / (positions * 2)
    assert min(seen.values()) > expected / 3 and max(seen.values()) < expected * 3


def test_train_without_flip_never_flips_and_without_pad_stays_inside() -> None:
    images = _unique_images(200, 8, seed=1)
    transform = BatchTransform(TransformSpec(crop=6), RAW_MEAN, RAW_STD, train=True)
    out = _raw(transform, images, _seeded(4))
    assert (out > 0).all(), "no padding zeros may appear when pad=0"
    for image, result in zip(images, out):
        windows, keys = _all_windows(image, 6, 0)
        match = (windows == result).flatten(1).all(1).nonzero().flatten().tolist()
        assert len(match) == 1 and not keys[match[0]][2]


def test_flip_only_mirrors_whole_images() -> None:
    images = _unique_images(64, 8, seed=2)
    out = _raw(BatchTransform(TransformSpec(flip=True), RAW_MEAN, RAW_STD, train=True), images, _seeded(5))
    flipped = torch.tensor([torch.equal(o, i.flip(-1).long()) for o, i in zip(out, images)])
    kept = torch.tensor([torch.equal(o, i.long()) for o, i in zip(out, images)])
    assert (flipped ^ kept).all()
    assert flipped.any() and kept.any()


def test_same_seed_same_output_different_seed_different_output() -> None:
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=_seeded(0))
    transform = BatchTransform(CIFAR_TRAIN, MEAN3, STD3, train=True)
    assert torch.equal(transform(images, _seeded(7)), transform(images, _seeded(7)))
    assert not torch.equal(transform(images, _seeded(7)), transform(images, _seeded(8)))


def test_resize_then_centre_crop_matches_torchvision() -> None:
    images = torch.randint(0, 256, (2, 3, 300, 280), dtype=torch.uint8, generator=_seeded(0))
    out = BatchTransform(CLOTHING_EVAL, RAW_MEAN, RAW_STD, train=False)(images)
    resized = TF.resize(images.float(), [256, 256], antialias=True)
    torch.testing.assert_close(out, TF.center_crop(resized, [224, 224]), atol=1e-3, rtol=0)


def test_resize_train_crop_is_a_window_of_the_resized_image() -> None:
    images = torch.randint(0, 256, (8, 3, 50, 60), dtype=torch.uint8, generator=_seeded(0))
    out = BatchTransform(TransformSpec(resize=40, crop=32), RAW_MEAN, RAW_STD, train=True)(images, _seeded(1))
    resized = TF.resize(images.float(), [40, 40], antialias=True)
    for sample, result in zip(resized, out):
        windows = sample.unfold(1, 32, 1).unfold(2, 32, 1)  # (3, 9, 9, 32, 32)
        error = (windows - result[:, None, None]).abs().amax(dim=(0, 3, 4))
        assert error.min() < 1e-3


def _from_config(cfg: dict, train: bool) -> BatchTransform:
    """A transform from a ``dataset.transforms`` block, built the way the run's settings build it."""
    part = "train" if train else "eval"
    spec = from_mapping(TransformSpec, cfg, f"dataset.transforms.{part}")
    return BatchTransform(spec, MEAN3, STD3, train=train)


def test_from_config_builds_presets_and_fills_defaults() -> None:
    transform = _from_config({"crop": 32, "pad": 4, "flip": True}, train=True)
    assert transform.spec == CIFAR_TRAIN and transform.train
    assert _from_config({}, train=False).spec == TransformSpec()
    assert TransformSpec(**{"crop": 32, "pad": 4, "flip": True}) == CIFAR_TRAIN


def test_transform_pair_builds_a_training_and_an_evaluation_transform() -> None:
    train, evaluation = TransformPair(CLOTHING_TRAIN, CLOTHING_EVAL).build(MEAN3, STD3)
    assert (train.spec, train.train) == (CLOTHING_TRAIN, True)
    assert (evaluation.spec, evaluation.train) == (CLOTHING_EVAL, False)


@pytest.mark.parametrize(
    ("cfg", "named"),
    [
        ({"crop": 0}, "crop=0"),
        ({"crop": -3}, "crop=-3"),
        ({"crop": True}, "crop=True"),
        ({"crop": 32.0}, "crop=32.0"),
        ({"resize": 0, "crop": 1}, "resize=0"),
        ({"crop": 32, "pad": -1}, "pad=-1"),
        ({"pad": 4}, "pad=4"),
        ({"flip": "yes"}, "flip='yes'"),
        ({"resize": 256, "crop": 257}, "crop=257"),
        ({"crop": 32, "scale": 2}, "scale"),
    ],
)
def test_bad_config_raises_config_error_naming_the_value(cfg: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        _from_config(cfg, train=False)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"crop": 0}, "crop=0 is invalid: allowed is an integer >= 1"),
        ({"pad": 2}, "pad=2 is invalid: a pad needs a crop size"),
        ({"flip": "yes"}, "flip='yes' is invalid: allowed is true or false"),
    ],
)
def test_transform_spec_names_the_bad_value_by_its_field(cfg: dict, message: str) -> None:
    with pytest.raises(InvalidValue, match=f"^{message}"):
        TransformSpec(**cfg)


def test_eval_crop_must_fit_without_padding() -> None:
    # Padding makes crop 260 fit a 256 image when training, but evaluation never pads.
    BatchTransform(TransformSpec(resize=256, crop=260, pad=2), MEAN3, STD3, train=True)
    with pytest.raises(ConfigError, match="crop=260"):
        BatchTransform(TransformSpec(resize=256, crop=260, pad=2), MEAN3, STD3, train=False)


@pytest.mark.parametrize(
    ("mean", "std", "named"),
    [
        ((0.5, 0.5, 0.5), (0.2, 0.0, 0.2), "std"),
        ((0.5, 0.5, 0.5), (0.2, -0.1, 0.2), "std"),
        ((0.5, float("nan"), 0.5), (0.2, 0.2, 0.2), "mean"),
        ((0.5, 0.5), (0.2, 0.2, 0.2), "mean"),
        ((), (), "mean"),
    ],
)
def test_bad_normalisation_raises_config_error(mean: tuple, std: tuple, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        BatchTransform(TransformSpec(), mean, std, train=True)


def test_batch_checked_at_call_time() -> None:
    transform = BatchTransform(TransformSpec(crop=32), MEAN3, STD3, train=True)
    with pytest.raises(ConfigError, match="1 channels"):
        transform(torch.zeros(2, 1, 32, 32, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="crop=32 does not fit 28x28"):
        transform(torch.zeros(2, 3, 28, 28, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="uint8"):
        transform(torch.zeros(2, 3, 32, 32))
