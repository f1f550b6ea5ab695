"""SCAFFOLD (Karimireddy et al., ICML 2020): stochastic controlled averaging.

The server keeps a control variate c, each client its own c_i (both start at 0, one array per model
parameter). Each round a sample S of the clients trains from the global model x with every gradient
corrected by c - c_i (client side: ``client/plugins/scaffold.py``), and each returns its model y_i
and the change of its control variate, c_i+ - c_i, where c_i+ = c_i - c + (x - y_i) / (K eta_l)
(Algorithm 1, option II: K local steps at learning rate eta_l). The server moves
    x <- x + eta_g * (1/|S|) sum_{i in S} (y_i - x)      over the parameters,
    c <- c + (1/N) sum_{i in S} (c_i+ - c_i)             (N: all clients),
and averages buffers (BatchNorm's statistics) plainly. ``docs/scaffold.md`` maps it to this code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from common.validation import Interval, option
from protocol.messages import read_plugin_arrays
from protocol.scaffold import PLUGIN
from strategies.aggregation import as_numpy, as_record, average_buffers
from strategies.base import TrainReply
from strategies.context import StrategyContext
from strategies.fedavg import FedAvg, client_states
from strategies.rounds import RoundSettings


@dataclass(frozen=True)
class ScaffoldSettings(RoundSettings):
    """FedAvg's schedule and SCAFFOLD's global step size (``conf/strategy/options/scaffold.yaml``)."""

    global_lr: float = option(Interval(float, 0.0, closed="neither"),
                              "eta_g, the server's step along the mean client update (the paper's experiments: 1)")


def scaffold_server_step(
    global_state: dict[str, np.ndarray],
    states: list[dict[str, np.ndarray]],
    control: dict[str, np.ndarray],
    changes: list[dict[str, np.ndarray]],
    *,
    global_lr: float,
    num_clients: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One SCAFFOLD aggregation: (new global state, new server control variate). ``control`` and the
    clients' ``changes`` hold the parameters (the keys of ``control``); the other arrays of the states
    are buffers, plainly averaged. Computed in float64, returned in each array's own dtype."""
    new_global = average_buffers(states, control)
    new_control: dict[str, np.ndarray] = {}
    for key, value in control.items():
        start = np.asarray(global_state[key], dtype=np.float64)
        step = np.mean([np.asarray(state[key], dtype=np.float64) - start for state in states], axis=0)
        new_global[key] = (start + global_lr * step).astype(np.asarray(global_state[key]).dtype)
        change = np.sum([np.asarray(delta[key], dtype=np.float64) for delta in changes], axis=0)
        new_control[key] = (np.asarray(value, dtype=np.float64) + change / num_clients).astype(value.dtype)
    return new_global, new_control


class Scaffold(FedAvg):
    """FedAvg's sampling with SCAFFOLD's corrected local steps and server step; its control variates
    follow the parameters of one network (``context.parameter_names``)."""

    name = "scaffold"
    settings: ScaffoldSettings
    two_networks = False
    plugin = PLUGIN
    needs_parameter_names = True

    def __init__(self, settings: ScaffoldSettings, context: StrategyContext, stage: str | None = None) -> None:
        super().__init__(settings, context, stage)
        self.control: dict[str, np.ndarray] = {}

    def node_state(self) -> bool:
        """True: its clients keep their control variate between rounds."""
        return True

    def plugin_arrays(self, pid: int) -> ArrayRecord:
        """The server control variate c (zeros, shaped like the parameters, before the first round)."""
        if not self.control:
            assert self.global_arrays is not None
            self.control = {name: np.zeros_like(self.global_arrays[name].numpy())
                            for name in self.context.parameter_names}
        return as_record(self.control)

    def read_train(self, content: RecordDict, sender: str) -> TrainReply:
        """A ``train`` reply with the client's control-variate change, shaped like c."""
        reply = super().read_train(content, sender)
        change = read_plugin_arrays(content, PLUGIN, sender, like=as_record(self.control))
        return TrainReply(reply.arrays, reply.result, as_numpy(change))

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """SCAFFOLD's server step on the new global model and c."""
        assert self.global_arrays is not None
        new_global, self.control = scaffold_server_step(
            as_numpy(self.global_arrays), client_states(replies), self.control,
            [reply.extra for reply in replies.values()], global_lr=self.settings.global_lr,
            num_clients=len(self.federation.partition_ids))
        return as_record(new_global)

    def result_blocks(self) -> dict[str, Any]:
        """The ``scaffold`` block: eta_g and the size of the server control variate at the end."""
        norm = float(np.sqrt(sum(float(np.sum(np.square(value, dtype=np.float64))) for value in self.control.values())))
        return {"scaffold": {"global_lr": self.settings.global_lr, "control_norm": norm}}
