"""A Flower ``Grid`` that delivers Messages to the real ClientApp in this process: no Ray, no network.

Each node has a real ``Context`` (``node_config`` with ``partition-id``/``num-partitions``, its own
``state``, the run config) that lives across messages, as a SuperNode's does. Messages travel as copies,
as serialised messages do. A ClientApp exception becomes an error reply with Flower's
``CLIENT_APP_RAISED_EXCEPTION`` code and the exception's traceback as its reason, and leaves the node's
context as it was, as Flower's simulation runtime does. Nodes can be silenced (they never answer, so a
round times out) to test failure policies, and the server can be killed before a given message.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Iterable
from uuid import uuid4

import numpy as np
from flwr.app import ArrayRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from protocol.messages import SCOPE

Handler = Callable[[Message, Context], Message]


class Killed(Exception):
    """The server's process died (raised by the grid before it delivers a message)."""


class LocalGrid(Grid):
    """``num_nodes`` nodes running ``client_app``; node k holds partition k.

    run_config: every node's ``context.run_config`` (``{"overrides": "..."}``).
    node_configs: per-partition changes to a node's ``node_config`` (e.g. a ``state-dir``); a key set
        to None is removed (``num-partitions``: a node as a deployed SuperNode's config has it).
    seed: draws the random 64-bit node ids, as Flower gives nodes random ids.
    kill_at: None, or the server dies (``Killed``) before it delivers message number ``kill_at``
        (counting the discovery queries): a kill mid-round leaves some of that round's nodes with
        state already written.
    """

    def __init__(self, client_app: Handler, *, num_nodes: int, run_config: dict,
                 node_configs: dict[int, dict] | None = None, seed: int = 0, kill_at: int | None = None) -> None:
        ids = np.random.default_rng(seed).choice(2**62, size=num_nodes, replace=False) + 2
        self.client_app = client_app
        self.node_ids = [int(node) for node in ids]
        configs = {pid: {"partition-id": pid, "num-partitions": num_nodes, **(node_configs or {}).get(pid, {})}
                   for pid in range(num_nodes)}
        self.contexts = {
            node: Context(run_id=1, node_id=node,
                          node_config={key: value for key, value in configs[pid].items() if value is not None},
                          state=RecordDict(), run_config=dict(run_config))
            for pid, node in enumerate(self.node_ids)
        }
        self.silent: set[int] = set()
        self.kill_at = kill_at
        self.delivered: list[Message] = []
        self._last_handled: dict[int, RecordDict] = {}
        """Per node, the state scope of the last message it handled (a RecordDict with its ``scope``
        record, if it carried one), copied as the message was delivered."""
        self._replies: dict[str, Message] = {}
        self._run = Run.create_empty(run_id=1)

    def node_of(self, partition_id: int) -> int:
        """The node id of the node holding ``partition_id``."""
        return self.node_ids[partition_id]

    def context_of(self, partition_id: int) -> Context:
        return self.contexts[self.node_of(partition_id)]

    def record_of(self, partition_id: int, key: str) -> ArrayRecord | None:
        """The node's stored record under ``key`` as the node itself reads it: within the state scope of
        the last message it handled (its versioned files under its state folder when that message
        carried a scope, else its ``context.state``); None when it never saved one. Reading leaves the
        node's context as it was."""
        from client.node import load_node
        from client.state_store import enter, load_record

        context = self.context_of(partition_id)
        scope = self._last_handled.get(self.node_of(partition_id))
        if scope is None:
            return load_record(context, key, partition_id)
        view = Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                       state=copy.deepcopy(context.state), run_config=context.run_config)
        enter(view, scope, load_node(view).settings.out_dir)
        return load_record(view, key, partition_id)

    def delivered_types(self) -> list[str]:
        """The message type of every delivered message, in order."""
        return [message.metadata.message_type for message in self.delivered]

    # --- Grid ----------------------------------------------------------------------------------

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            if self.kill_at is not None and len(self.delivered) >= self.kill_at:
                raise Killed
            message.metadata.__dict__["_message_id"] = str(uuid4())
            ids.append(message.metadata.message_id)
            self.delivered.append(message)
            node = message.metadata.dst_node_id
            if node in self.silent:
                continue
            self._last_handled[node] = RecordDict(
                {SCOPE: copy.deepcopy(message.content[SCOPE])} if SCOPE in message.content else {})
            reply = self._handle(copy.deepcopy(message), self.contexts[node])
            reply.metadata.__dict__["_message_id"] = str(uuid4())
            self._replies[message.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(mid) for mid in message_ids if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return list(self.pull_messages(list(self.push_messages(messages))))

    def _handle(self, message: Message, context: Context) -> Message:
        before = copy.deepcopy(context.state)
        try:
            return self.client_app(message, context)
        except Exception:  # noqa: BLE001 - the runtime reports any ClientApp exception as an error reply
            context.state = before
            reason = traceback.format_exc()
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
