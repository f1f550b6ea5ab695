"""Plumbing every strategy of ours shares: addressing clients by partition id, seeded sampling,
checking replies against a failure policy, and a log of who took part in each round."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from data.errors import ConfigError
from strategies.federation import Federation
from strategies.utils import answering_node, short_reason

log = logging.getLogger(__name__)

ON_CLIENT_ERROR = ("fail", "skip")


class ClientFailure(RuntimeError):
    """A client raised or did not answer in time, and the policy says the round must fail."""


@dataclass(frozen=True)
class RoundInfo:
    """One finished round: which clients trained, in which stage, and the participations so far."""

    round: int
    stage: str
    clients: list[int]
    comm_cost: int
    train_loss: float | None


class FederatedStrategy(Strategy):
    """Base class: subclasses implement Flower's ``configure_train``/``aggregate_train`` (or their own
    ``start``) using ``messages``/``exchange`` and ``collect_replies`` below, and call
    ``record_round`` once per round.

    rng: the generator every client-sampling decision draws from (seeded from the run's seed).
    on_client_error: "fail" stops the run when a client raises or times out, naming its
        partition; "skip" drops that client from the round with a warning.
    history: the round log to append to; a strategy nested in another (FedCorr's stage 3) shares
        its parent's, so rounds and communication cost run on across stages.
    """

    def __init__(
        self, *, rng: np.random.Generator, on_client_error: str = "fail", history: list[RoundInfo] | None = None
    ) -> None:
        if on_client_error not in ON_CLIENT_ERROR:
            raise ConfigError(
                f"server.on_client_error={on_client_error!r} is invalid: allowed are {', '.join(ON_CLIENT_ERROR)}"
            )
        self.rng = rng
        self.on_client_error = on_client_error
        self._federation: Federation | None = None
        self.history: list[RoundInfo] = [] if history is None else history
        self._sent: dict[int, Message] = {}

    @property
    def federation(self) -> Federation:
        if self._federation is None:
            raise RuntimeError("bind(federation) must be called before the strategy starts")
        return self._federation

    def bind(self, federation: Federation) -> None:
        """Tell the strategy which node holds which partition (from the server's discovery round)."""
        self._federation = federation

    @property
    def comm_cost(self) -> int:
        """Client participations so far (the FedCorr paper's communication cost)."""
        return self.history[-1].comm_cost if self.history else 0

    def planned_rounds(self) -> int:
        """How many rounds the run will take (for progress and the final evaluation)."""
        raise NotImplementedError

    def extra_results(self) -> dict[str, Any]:
        """Method-specific blocks for results.json (e.g. FedCorr's detection metrics)."""
        return {}

    def messages(self, contents: dict[int, RecordDict], message_type: str) -> list[Message]:
        """One message per client (partition id -> its content); remembers whom it was sent to."""
        self._sent = {
            pid: Message(content=content, message_type=message_type, dst_node_id=self.federation.node_of[pid])
            for pid, content in contents.items()
        }
        return list(self._sent.values())

    def partition_of_reply(self, reply: Message) -> int:
        """The partition a reply answers for (see ``answering_node``)."""
        return self.federation.partition_of(answering_node(reply, self._sent.values()))

    def exchange(self, grid: Grid, contents: dict[int, RecordDict], message_type: str, timeout: float) -> dict[int, RecordDict]:
        """Send, wait at most ``timeout`` seconds, and return the replies that pass the failure policy."""
        return self.collect_replies(grid.send_and_receive(self.messages(contents, message_type), timeout=timeout))

    def collect_replies(self, replies: Iterable[Message]) -> dict[int, RecordDict]:
        """Replies by partition id, after applying the failure policy to errors and missing replies."""
        good: dict[int, RecordDict] = {}
        failed: dict[int, str] = {}
        for reply in replies:
            pid = self.partition_of_reply(reply)
            if reply.has_error():
                log.debug("client %d failed with:\n%s", pid, reply.error.reason)
                failed[pid] = f"client {pid} failed: {short_reason(reply.error.reason)}"
            else:
                good[pid] = reply.content
        for pid in self._sent:
            if pid not in good and pid not in failed:
                failed[pid] = f"client {pid} did not reply in time"
        if failed and (self.on_client_error == "fail" or not good):
            left = "" if good else " (no client left in the round)"
            raise ClientFailure("; ".join(failed[pid] for pid in sorted(failed)) + left)
        for pid in sorted(failed):
            log.warning("%s; skipped (server.on_client_error=skip)", failed[pid])
        return dict(sorted(good.items()))

    def record_round(self, server_round: int, stage: str, clients: list[int], train_loss: float | None) -> RoundInfo:
        info = RoundInfo(server_round, stage, sorted(clients), self.comm_cost + len(clients), train_loss)
        self.history.append(info)
        return info
