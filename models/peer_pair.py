"""Two networks of one architecture held as one model: Co-teaching's peers.

The pair's state dict holds each network's tensors under ``first.`` and ``second.``, so averaging the
clients' pairs key by key aggregates each network with its twin. ``forward`` is the first network's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

PEER_NAMES = ("first", "second")


class PeerPair(nn.Module):
    """first, second: the two networks (same architecture, their own weights)."""

    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__()
        self.first = first
        self.second = second

    @property
    def members(self) -> tuple[nn.Module, nn.Module]:
        """(first, second)."""
        return self.first, self.second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The first network's logits."""
        return self.first(x)


def is_pair_state(keys: Iterable[str]) -> bool:
    """Whether state-dict ``keys`` are a ``PeerPair``'s: every key under ``first.`` or ``second.``."""
    keys = list(keys)
    return bool(keys) and all(key.split(".", 1)[0] in PEER_NAMES for key in keys)
