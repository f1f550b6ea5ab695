"""FedDyn's train instruction: ``train`` with plug-in ``feddyn`` runs FedDyn's local objective."""

from __future__ import annotations

from dataclasses import dataclass

from common.validation import Checked, Interval, option

PLUGIN = "feddyn"


@dataclass(frozen=True)
class FedDynIns(Checked):
    """FedDyn's instruction to its clients."""

    alpha: float = option(Interval(float, 0.0, closed="neither"), "the dynamic regulariser's coefficient")
