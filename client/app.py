"""The Flower ClientApp: ``clientapp = "client.app:app"`` in pyproject.toml.

Handlers only translate messages; the work happens in plain functions (``client.update``,
``client.training``, ``client.evaluation``) that are tested without Flower.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.evaluation import evaluate as evaluate_model
from client.node import load_node
from client.update import local_update

app = ClientApp()


@app.query("info")
def info(message: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how many training samples it has."""
    node = load_node(context)
    metrics = MetricRecord({"partition-id": node.partition_id, "num-examples": len(node.data)})
    return Message(RecordDict({"info": metrics}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Local SGD from the global arrays on this node's (noisy) labels."""
    config = dict(message.content["config"])
    server_round = int(config.pop("server-round"))
    state, metrics = local_update(load_node(context), message.content["arrays"].to_torch_state_dict(),
                                  config, server_round)
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(metrics)}), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Score the global arrays on this node's local set (its current labels)."""
    node = load_node(context)
    model = node.new_model()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    scores = evaluate_model(model, node.data.images, node.data.labels,
                            node.eval_transform, device=node.device)
    return Message(RecordDict({"metrics": MetricRecord(scores)}), reply_to=message)
