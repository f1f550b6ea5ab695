"""The Flower ClientApp: ``clientapp = "client.app:app"`` in pyproject.toml.

Handlers only translate messages; the work happens in plain functions (``client.training``,
``client.evaluation``) that are tested without Flower.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.evaluation import evaluate as evaluate_model
from client.node import LocalNode, load_node
from client.training import TrainConfig, train_local

app = ClientApp()


def _model_from(message: Message, node: LocalNode) -> torch.nn.Module:
    model = node.new_model()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    return model


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().cpu() for key, value in model.state_dict().items()}


@app.query("info")
def info(message: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how many training samples it has."""
    node = load_node(context)
    metrics = MetricRecord({"partition-id": node.partition_id, "num-examples": len(node.data)})
    return Message(RecordDict({"info": metrics}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Local SGD from the global arrays on this node's (noisy) labels."""
    node = load_node(context)
    config = dict(message.content["config"])
    server_round = int(config.pop("server-round"))
    settings = TrainConfig.from_mapping(config)
    model = _model_from(message, node)
    anchor = [p.detach().clone() for p in model.parameters()] if settings.prox_weight > 0 else None
    metrics = train_local(model, node.data.images, node.data.labels, node.train_transform, settings,
                          generator=node.generator(server_round), device=node.device, global_params=anchor)
    content = RecordDict({"arrays": ArrayRecord(_cpu_state(model)), "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Score the global arrays on this node's local set (its current labels)."""
    node = load_node(context)
    scores = evaluate_model(_model_from(message, node), node.data.images, node.data.labels,
                            node.eval_transform, device=node.device)
    return Message(RecordDict({"metrics": MetricRecord(scores)}), reply_to=message)
