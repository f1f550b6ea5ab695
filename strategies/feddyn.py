"""FedDyn (Acar et al. 2021): federated learning with dynamic regularisation.

Server state h starts at 0. Each round the sampled clients P_t train from w^{t-1} with FedDyn's
local objective (client side: ``client/methods/feddyn.py``) and the server updates
    h^t = h^{t-1} - alpha * (1/N) * sum_{k in P_t} (w_k^t - w^{t-1})
    w^t = (1/|P_t|) * sum_{k in P_t} w_k^t - h^t / alpha
over the model's parameters (N: all clients). BatchNorm buffers are not parameters: they are plainly
averaged. The learning rate decays by ``lr_decay`` per FedDyn round (FedCorr Appendix B: 0.998).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from common.errors import ConfigError
from common.validation import Number, check_fields, rule
from protocol.feddyn import METHOD, FedDynOptions
from protocol.messages import TrainIns
from strategies.aggregation import as_numpy, as_record, weighted_average
from strategies.base import TrainReply
from strategies.environment import Environment
from strategies.fedavg import FedAvg, client_states
from strategies.registry import RoundMethod, round_entry


@dataclass(frozen=True)
class FedDynSettings:
    """alpha: the dynamic regulariser's coefficient (> 0; FedCorr Appendix B: 0.01).
    lr_decay: per-round learning-rate factor in (0, 1] (0.998). ``conf/strategy/method/feddyn.yaml``."""

    alpha: float = field(metadata=rule(Number(low=0.0, low_open=True)))
    lr_decay: float = field(metadata=rule(Number(low=0.0, high=1.0, low_open=True)))

    def __post_init__(self) -> None:
        check_fields(self)


def feddyn_server_step(
    global_state: Mapping[str, np.ndarray],
    states: Sequence[Mapping[str, np.ndarray]],
    h: Mapping[str, np.ndarray],
    *,
    alpha: float,
    num_clients: int,
    parameter_names: Collection[str],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One FedDyn aggregation: (new global state, new h). ``h`` lacks a key until it is first set
    (zero). Parameters are computed in float64 and returned in their own dtype."""
    buffers = [{key: value for key, value in state.items() if key not in parameter_names} for state in states]
    new_global = weighted_average(buffers, [1.0] * len(states)) if buffers[0] else {}
    new_h: dict[str, np.ndarray] = {}
    for key in parameter_names:
        start = np.asarray(global_state[key], dtype=np.float64)
        local = np.stack([np.asarray(state[key], dtype=np.float64) for state in states])
        drift = (local - start).sum(axis=0)
        new_h[key] = np.asarray(h.get(key, 0.0), dtype=np.float64) - alpha / num_clients * drift
        new_global[key] = (local.mean(axis=0) - new_h[key] / alpha).astype(np.asarray(states[0][key]).dtype)
    return new_global, new_h


class FedDyn(FedAvg):
    """FedAvg's sampling with FedDyn's client objective and server correction.

    alpha: the dynamic regulariser's coefficient.
    lr_decay: the local learning rate is ``train.lr * lr_decay ** r`` in FedDyn's r-th round (from 0,
        ``stage_rounds``).
    parameter_names: the model's parameter keys (``named_parameters``); the other arrays are buffers.
    Other arguments: see ``FedAvg``.
    """

    def __init__(self, *, alpha: float, lr_decay: float, parameter_names: Collection[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not parameter_names:
            raise ConfigError("FedDyn needs the model's parameter names; none were given")
        self.alpha = alpha
        self.lr_decay = lr_decay
        self.parameter_names = tuple(parameter_names)
        self.h: dict[str, np.ndarray] = {}

    def train_instruction(self, server_round: int) -> TrainIns:
        """FedAvg's instruction for the FedDyn client, at this FedDyn round's decayed learning rate."""
        ins = super().train_instruction(server_round)
        lr = self.train.lr * self.lr_decay ** self.stage_rounds
        return replace(ins, training=ins.training.but(lr=lr), method=METHOD)

    def train_options(self) -> FedDynOptions:
        """The FedDyn client's ``alpha``."""
        return FedDynOptions(alpha=self.alpha)

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedDyn's server step: the clients' mean corrected by the updated state h."""
        assert self.global_arrays is not None
        new_global, self.h = feddyn_server_step(
            as_numpy(self.global_arrays), client_states(replies), self.h, alpha=self.alpha,
            num_clients=len(self.federation.partition_ids), parameter_names=self.parameter_names,
        )
        return as_record(new_global)


def _feddyn_arguments(options: FedDynSettings, env: Environment) -> dict[str, Any]:
    return {"alpha": options.alpha, "lr_decay": options.lr_decay, "parameter_names": env.parameter_names}


# FedDyn's server state and client correction follow the parameters of one network.
STRATEGY = round_entry("feddyn", RoundMethod(FedDynSettings, FedDyn, extra=_feddyn_arguments, two_networks=False))
