"""FedDyn's train options: ``train`` with method ``feddyn`` runs FedDyn's local objective."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.validation import Number, check_fields, rule

METHOD = "feddyn"


@dataclass(frozen=True)
class FedDynOptions:
    """alpha: the dynamic regulariser's coefficient (> 0)."""

    alpha: float = field(metadata=rule(Number(low=0.0, low_open=True)))

    def __post_init__(self) -> None:
        check_fields(self)
