"""ImageNet ResNet-50 (torchvision), optionally loaded from a local pretrained state dict."""

from pathlib import Path

import torch
from torch import nn

from common.errors import ConfigError, InvalidValue

_IMAGENET_CLASSES = 1000
_FC_KEYS = frozenset({"fc.weight", "fc.bias"})


def _describe(path: Path) -> str:
    return f"resnet50 weights file {str(path)!r}"


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unreadable file is the same user mistake
        raise ConfigError(f"{_describe(path)} is not a readable torch state dict: {error}") from error
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{_describe(path)} does not hold a state dict of tensors")
    return state


def _load_backbone(model: nn.Module, path: Path, keep_fc: bool) -> None:
    """Load every tensor strictly, except fc when the head is being replaced."""
    state = _read_state_dict(path)
    if not keep_fc:
        state = {k: v for k, v in state.items() if k not in _FC_KEYS}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shape mismatches
        raise ConfigError(f"{_describe(path)} does not fit torchvision's resnet50: {error}") from error
    missing = set(missing) - (set() if keep_fc else _FC_KEYS)
    if missing or unexpected:
        raise ConfigError(
            f"{_describe(path)} is not a torchvision resnet50 state dict; "
            f"missing keys: {sorted(missing)[:5]}, unexpected keys: {sorted(unexpected)[:5]}"
        )


def _replace_stem(model: nn.Module, in_channels: int, pretrained: bool) -> None:
    """Swap conv1 for an ``in_channels`` one.

    Pretrained: every input channel gets the mean RGB filter scaled by 3 / in_channels, so an image
    whose channels are all equal excites conv1 exactly as its RGB copy did.
    """
    old = model.conv1
    assert isinstance(old, nn.Conv2d)  # torchvision's ResNet stem
    # Conv2d stores kernel_size/stride/padding as 2-tuples typed tuple[int, ...]; its __init__ wants tuple[int, int].
    new = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, old.stride, old.padding,  # type: ignore[arg-type]
                    bias=False)
    if pretrained:
        mean_filter = old.weight.detach().mean(dim=1, keepdim=True)
        new.weight.data.copy_(mean_filter.expand_as(new.weight) * (3 / in_channels))
    else:
        nn.init.kaiming_normal_(new.weight, mode="fan_out", nonlinearity="relu")  # torchvision's conv init
    model.conv1 = new


def check_resnet50_options(options: dict) -> None:
    """Check ``pretrained`` against ``weights_path`` before any work (see ``resnet50``)."""
    pretrained, weights_path = options.get("pretrained"), options.get("weights_path")
    if pretrained not in (None, True, False):
        raise InvalidValue("model.pretrained", pretrained, "allowed are true, false or null")
    if pretrained is True and weights_path is None:
        raise InvalidValue(
            "model.weights_path", None,
            "this setting uses an ImageNet-pretrained ResNet-50 (model.pretrained=true; FedCorr Table 1 for "
            "Clothing1M): give the path of a local torchvision resnet50 state dict (never downloaded), or "
            "model.pretrained=false to train from random initialisation",
        )
    if pretrained is False and weights_path is not None:
        raise InvalidValue("model.weights_path", weights_path,
                           "model.pretrained=false asks for random initialisation: allowed is null")
    if weights_path is not None and not Path(weights_path).expanduser().is_file():
        raise InvalidValue("model.weights_path", weights_path,
                           "allowed is an existing file: a local torchvision ImageNet resnet50 state dict "
                           "(weights are never downloaded); no such file here")


def resnet50(num_classes: int, in_channels: int, weights_path: str | Path | None = None,
             pretrained: bool | None = None) -> nn.Module:
    """The torchvision ResNet-50; ``weights_path`` names a local ImageNet state dict (never downloaded).

    pretrained: None loads ``weights_path`` if given; True requires it (a setting whose paper uses
        pretrained weights); False is random initialisation and refuses a ``weights_path``.
    With weights, all tensors load strictly; when ``num_classes`` != 1000 the fc layer is a fresh
    one instead. ``in_channels`` != 3 replaces conv1 (see ``_replace_stem``).
    """
    check_resnet50_options({"pretrained": pretrained, "weights_path": weights_path})
    path = None if weights_path is None else Path(weights_path).expanduser()
    import torchvision  # lazy: importing torchvision costs ~2 s in every ClientApp process

    model = torchvision.models.resnet50(weights=None, num_classes=num_classes)
    if path is not None:
        _load_backbone(model, path, keep_fc=num_classes == _IMAGENET_CLASSES)
    if in_channels != 3:
        _replace_stem(model, in_channels, pretrained=path is not None)
    return model
