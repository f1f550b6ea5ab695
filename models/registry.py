"""Name -> network registry: validates a model request and builds it."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from common.errors import ConfigError
from models.cnn9 import CNN9
from models.lenet import LeNet5
from models.resnet50 import check_resnet50_options, resnet50
from models.resnet_cifar import resnet18, resnet34
from models.small_cnn import SmallCNN
from models.vgg import vgg11


@dataclass(frozen=True)
class _RegisteredModel:
    """A registry entry: how to build the model, the smallest square input it can take, and the check of
    its options that can run before any work (None: the option names are all there is to check)."""

    build: Callable[..., nn.Module]
    min_image_size: int
    check: Callable[[dict[str, Any]], None] | None = None


_REGISTRY: dict[str, _RegisteredModel] = {
    "lenet5": _RegisteredModel(LeNet5, LeNet5.MIN_IMAGE_SIZE),
    "small_cnn": _RegisteredModel(SmallCNN, SmallCNN.MIN_IMAGE_SIZE),
    "cnn9": _RegisteredModel(CNN9, CNN9.MIN_IMAGE_SIZE),
    "resnet18": _RegisteredModel(resnet18, 1),
    "resnet34": _RegisteredModel(resnet34, 1),
    "resnet50": _RegisteredModel(resnet50, 1, check_resnet50_options),
    "vgg11": _RegisteredModel(vgg11, 1),
}

MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def check_model_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a registered model."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ConfigError(f"model={name!r} is invalid: allowed are {', '.join(MODEL_NAMES)}")


def _check_positive_int(what: str, value: object) -> None:
    # bool is an int subclass, but True classes/channels is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")


def _check_kwargs(name: str, parameters: set[str], kwargs: dict[str, Any]) -> None:
    accepted = parameters - {"num_classes", "in_channels", "image_size"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise ConfigError(f"model {name!r} does not take option(s) {', '.join(unknown)}; allowed: {allowed}")


def check_model_options(name: str, options: dict[str, Any]) -> None:
    """Raise ConfigError unless ``name`` is registered and takes every option in ``options``."""
    check_model_name(name)
    _check_kwargs(name, set(inspect.signature(_REGISTRY[name].build).parameters), options)
    check = _REGISTRY[name].check
    if check is not None:
        check(options)


@dataclass(frozen=True)
class ModelSpec:
    """A network by registered name with its own options (``conf/model/<name>.yaml``), checked when built.

    The dataset supplies ``num_classes``, ``in_channels`` and the image size at build time.
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_model_options(self.name, self.options)


def build_model(
    name: str, *, num_classes: int, in_channels: int, image_size: int | None = None, **kwargs: Any
) -> nn.Module:
    """Build model ``name`` for ``in_channels``-channel square images of side ``image_size``.

    ``image_size`` is checked against the model's minimum and, for models whose classifier head
    depends on it (``lenet5``, ``small_cnn``), sizes that head; left out, those models assume their
    native size (32 and 28). Extra keyword arguments go to the model (e.g. ``weights_path`` for
    ``resnet50``). Weights are initialised from torch's global RNG, so ``torch.manual_seed`` fixes them.
    """
    check_model_name(name)
    spec = _REGISTRY[name]
    _check_positive_int("num_classes", num_classes)
    _check_positive_int("in_channels", in_channels)
    if image_size is not None:
        _check_positive_int("image_size", image_size)
        if image_size < spec.min_image_size:
            raise ConfigError(
                f"model {name!r} cannot take {image_size}x{image_size} images; "
                f"minimum is {spec.min_image_size}x{spec.min_image_size}"
            )
    parameters = set(inspect.signature(spec.build).parameters)
    _check_kwargs(name, parameters, kwargs)
    if "image_size" in parameters and image_size is not None:
        kwargs["image_size"] = image_size
    return spec.build(num_classes=num_classes, in_channels=in_channels, **kwargs)
