"""The Flower ClientApp: ``clientapp = "client.app:app"`` in pyproject.toml.

Handlers only translate messages; the work happens in plain functions (``client.update``,
``client.training``, ``client.evaluation``, ``client.lid``, ``client.correction``) that are tested
without Flower. Protocol (see DESIGN.md):

- ``query.info`` -> {"info": {partition-id, num-examples}}
- ``train`` {"arrays", "config": TrainConfig keys + server-round [+ compute-lid, lid-k]
  [+ feddyn-alpha]} -> {"arrays", "metrics": {train_loss, num-examples, steps [, lid]}}; trains on
  the current (possibly corrected) labels. With feddyn-alpha the client runs FedDyn's local
  objective and keeps its correction term as client state.
- ``evaluate`` {"arrays"} -> {"metrics": {loss, accuracy, num-examples}} on the local set.
- ``query.loss`` {"arrays"} -> the same metrics as ``evaluate`` (Power-of-Choice's candidate query).
- ``query.correct`` {"arrays", "config": {mode: stage1|stage2, pi, theta, relabel, seed, diagnostics}}
  -> {"metrics": {mu_hat, n_relabeled [, ground-truth diagnostics]}}; keeps the new labels.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.correction import loss_split, stage1_relabel, stage2_relabel
from client.evaluation import evaluate as evaluate_model
from client.evaluation import loss_and_proba, predict_proba
from client.feddyn import load_correction, store_correction, updated_correction
from client.label_state import current_labels, store_labels
from client.lid import lid_score
from client.node import LocalNode, load_node
from client.update import cpu_state, local_update
from data.seeding import rng_for

app = ClientApp()

# Train-config keys that steer the client but are not local-SGD settings.
_LID_KEYS = ("compute-lid", "lid-k")
FEDDYN_KEY = "feddyn-alpha"


def _global_model(message: Message, node: LocalNode):
    model = node.new_model()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    return model


@app.query("info")
def info(message: Message, context: Context) -> Message:
    """Tell the server which partition this node holds and how many training samples it has."""
    node = load_node(context)
    metrics = MetricRecord({"partition-id": node.partition_id, "num-examples": len(node.data)})
    return Message(RecordDict({"info": metrics}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Local SGD from the global arrays on this node's current labels; FedCorr's stage 1 also asks
    for the LID score of the trained model's predictions on the local set, FedDyn for its objective."""
    node = load_node(context)
    config = dict(message.content["config"])
    server_round = int(config.pop("server-round"))
    lid = {key: config.pop(key) for key in _LID_KEYS if key in config}
    alpha = config.pop(FEDDYN_KEY, None)
    global_state = message.content["arrays"].to_torch_state_dict()
    correction = None
    if alpha is not None:
        # FedDyn's quadratic term is alpha/2 ||w - w_global||^2: the squared proximal term.
        config.update(prox_weight=float(alpha) / 2, prox_norm="squared")
        names = node.parameter_names
        correction = load_correction(context, node.partition_id, {name: global_state[name] for name in names})
    model, metrics = local_update(node, global_state, config, server_round,
                                  labels=current_labels(context, node), linear_terms=correction)
    if correction is not None:
        local = dict(model.named_parameters())
        store_correction(context, node.partition_id, names,
                         updated_correction(correction, local, global_state, names, float(alpha)))
    if lid.get("compute-lid"):
        probabilities = predict_proba(model, node.data.images, node.eval_transform, device=node.device)
        metrics["lid"] = lid_score(probabilities, k=int(lid.get("lid-k", 20)))
    return Message(RecordDict({"arrays": ArrayRecord(cpu_state(model)), "metrics": MetricRecord(metrics)}),
                   reply_to=message)


def _local_scores(message: Message, context: Context) -> Message:
    node = load_node(context)
    scores = evaluate_model(_global_model(message, node), node.data.images, current_labels(context, node),
                            node.eval_transform, device=node.device)
    return Message(RecordDict({"metrics": MetricRecord(scores)}), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Score the global arrays on this node's local set (its current labels)."""
    return _local_scores(message, context)


@app.query("loss")
def loss(message: Message, context: Context) -> Message:
    """The global model's loss on this node's local set: Power-of-Choice picks high-loss clients."""
    return _local_scores(message, context)


def _diagnostics(node: LocalNode, before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    """Ground-truth label noise before/after and how many changed labels became right. Only a node
    that knows its true labels (simulation, rehearsal) can compute them; a real node has none."""
    known = node.data.true_labels >= 0
    truth = node.data.true_labels
    changed = known & (before != after)
    return {
        "known": int(known.sum()),
        "wrong-before": int(np.sum(known & (before != truth))),
        "wrong-after": int(np.sum(known & (after != truth))),
        "changed": int(changed.sum()),
        "changed-correct": int(np.sum(changed & (after == truth))),
    }


@app.query("correct")
def correct(message: Message, context: Context) -> Message:
    """FedCorr's label correction with the global model (paper Sec. 3.2 step 2-3, Sec. 3.3)."""
    node = load_node(context)
    config = message.content["config"]
    labels = current_labels(context, node)
    losses, probabilities = loss_and_proba(_global_model(message, node), node.data.images, labels,
                                           node.eval_transform, device=node.device)
    if config["mode"] == "stage1":
        seed = int(rng_for(int(config["seed"]), f"loss-gmm/{node.partition_id}").integers(2**31))
        noisy = loss_split(losses, seed)
        new, mu_hat, _ = stage1_relabel(labels, losses, probabilities, noisy,
                                        pi=float(config["pi"]), theta=float(config["theta"]))
    elif config["mode"] == "stage2":
        new, _ = stage2_relabel(labels, probabilities, theta=float(config["theta"]))
        mu_hat = None
    else:
        raise ValueError(f"query.correct mode={config['mode']!r} is invalid: allowed are stage1, stage2")
    if not config["relabel"]:
        new = labels
    store_labels(context, node, new)
    metrics = {"n_relabeled": int(np.sum(new != labels))}
    if mu_hat is not None:
        metrics["mu_hat"] = mu_hat
    if config["diagnostics"] and (node.data.true_labels >= 0).any():
        metrics.update(_diagnostics(node, labels, new))
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)
