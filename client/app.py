"""The Flower ClientApp (``clientapp = "client.app:app"`` in pyproject.toml): decode, dispatch, encode.

The messages are defined in ``protocol``; the work happens in plain functions: local training in a
plug-in (``client/plugins/``: plain training or a method's), evaluation in ``task.evaluation``. Every
plug-in's own queries are registered here from the plug-in registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from client.label_state import current_labels
from client.node import LocalNode, load_node, sends_ground_truth, simulated_federation_size
from client.plugins.base import QueryHandler
from client.plugins.registry import plugin, plugins
from client.state_store import enter, held_round, mark_answered, state_root
from client.update import cpu_state
from protocol.messages import SERVER, HeldState, NodeInfo, TrainIns, read_arrays, read_instruction, reply
from task.evaluation import evaluate as evaluate_model

app = ClientApp()


def node_for(message: Message, context: Context) -> LocalNode:
    """The node's view of the run, with the instruction's state scope entered (``client.state_store``)."""
    node = load_node(context)
    enter(context, message.content, node.settings.out_dir)
    return node


@contextmanager
def answering(message: Message, context: Context) -> Iterator[LocalNode]:
    """``node_for``; once the work in the block is done, the round is recorded as one the node answered
    in, with the version of each record it holds then (``mark_answered``; not when the work failed)."""
    node = node_for(message, context)
    yield node
    mark_answered(context, node.partition_id)


@app.query("info")
def info(message: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how many training samples it has. A node
    config the node cannot use fails here, in the run's first exchange."""
    node = load_node(context)
    sends_ground_truth(context)
    keeps_state = int(state_root(context, node.settings.out_dir) is not None)
    info = NodeInfo(node.partition_id, len(node.data), keeps_state, simulated_federation_size(context))
    return Message(reply(info), reply_to=message)


@app.query("held")
def held(message: Message, context: Context) -> Message:
    """Before a run continues from a checkpoint: the last round, up to that checkpoint, this node's
    state says it answered in (the server refuses to go on when a node lost state it had)."""
    node = node_for(message, context)
    return Message(reply(HeldState(held_round(context, node.partition_id))), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Train with the plug-in the instruction names, from the global arrays, on the current labels."""
    with answering(message, context) as node:
        ins = read_instruction(message.content, TrainIns)
        trained = plugin(ins.plugin).train(node, context, ins, message.content)
    content = reply(trained.stats, arrays=ArrayRecord(cpu_state(trained.model)), extra=trained.extra,
                    plugin_arrays=trained.arrays, plugin=ins.plugin)
    return Message(content, reply_to=message)


def _local_scores(message: Message, context: Context) -> Message:
    with answering(message, context) as node:
        state = read_arrays(message.content, SERVER).to_torch_state_dict()
        model = node.model_for_state(state.keys())
        model.load_state_dict(state)
        scores = evaluate_model(model, node.data.images, current_labels(context, node), node.eval_transform,
                                device=node.device)
    return Message(reply(scores), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Score the global arrays on this node's local set (its current labels)."""
    return _local_scores(message, context)


@app.query("loss")
def loss(message: Message, context: Context) -> Message:
    """The global model's loss on this node's local set: Power-of-Choice picks high-loss clients."""
    return _local_scores(message, context)


def _query(handler: QueryHandler) -> Callable[[Message, Context], Message]:
    def handle(message: Message, context: Context) -> Message:
        with answering(message, context) as node:
            content = handler(node, context, message.content)
        return Message(content, reply_to=message)

    handle.__doc__ = handler.__doc__
    return handle


for _plugin in plugins().values():
    for _action, _handler in _plugin.queries().items():
        app.query(_action)(_query(_handler))
