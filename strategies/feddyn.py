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
from dataclasses import dataclass, replace

import numpy as np
from flwr.app import ArrayRecord

from common.validation import Interval, option
from protocol.feddyn import PLUGIN, FedDynIns
from protocol.messages import TrainIns
from strategies.aggregation import as_numpy, as_record, average_buffers
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.fedavg import FedAvg, client_states
from strategies.rounds import RoundSettings


@dataclass(frozen=True)
class FedDynSettings(RoundSettings):
    """FedAvg's schedule and FedDyn's coefficients (``conf/strategy/options/feddyn.yaml``)."""

    alpha: float = option(Interval(float, 0.0, closed="neither"),
                          "the dynamic regulariser's coefficient (FedCorr Appendix B: 0.01)")
    lr_decay: float = option(Interval(float, 0.0, 1.0, closed="right"),
                             "the local learning rate's factor per FedDyn round (0.998)")


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
    new_global = average_buffers(states, parameter_names)
    new_h: dict[str, np.ndarray] = {}
    for key in parameter_names:
        start = np.asarray(global_state[key], dtype=np.float64)
        local = np.stack([np.asarray(state[key], dtype=np.float64) for state in states])
        drift = (local - start).sum(axis=0)
        new_h[key] = np.asarray(h.get(key, 0.0), dtype=np.float64) - alpha / num_clients * drift
        new_global[key] = (local.mean(axis=0) - new_h[key] / alpha).astype(np.asarray(states[0][key]).dtype)
    return new_global, new_h


class FedDyn(FedAvg):
    """FedAvg's sampling with FedDyn's client objective and server correction. The local learning rate
    is ``train.lr * lr_decay ** r`` in FedDyn's r-th round (from 0, ``stage_rounds``); the model's
    parameters (``context.parameter_names``) get the correction, the other arrays are buffers. Its
    server state and client correction follow the parameters of one network."""

    name = "feddyn"
    settings: FedDynSettings
    two_networks = False
    plugin = PLUGIN
    needs_parameter_names = True

    def __init__(self, settings: FedDynSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage)
        self.h: dict[str, np.ndarray] = {}

    def node_state(self) -> bool:
        """True: its clients keep their correction term between rounds."""
        return True

    def train_instruction(self, server_round: int) -> TrainIns:
        """FedAvg's instruction at this FedDyn round's decayed learning rate."""
        ins = super().train_instruction(server_round)
        lr = self.train.lr * self.settings.lr_decay ** self.stage_rounds
        return replace(ins, training=ins.training.but(lr=lr))

    def plugin_ins(self, pid: int) -> FedDynIns:
        """The FedDyn plug-in's ``alpha``."""
        return FedDynIns(alpha=self.settings.alpha)

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """FedDyn's server step: the clients' mean corrected by the updated state h."""
        assert self.global_arrays is not None
        new_global, self.h = feddyn_server_step(
            as_numpy(self.global_arrays), client_states(replies), self.h, alpha=self.settings.alpha,
            num_clients=len(self.federation.partition_ids), parameter_names=self.context.parameter_names,
        )
        return as_record(new_global)
