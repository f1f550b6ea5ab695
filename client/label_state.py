"""FedCorr's client state across rounds: the labels a client trains on, and its kept local losses.

FedCorr relabels samples on the client; the corrected labels must outlive the message that made
them. Likewise the per-sample losses of the client's local model after its stage-1 training, which
the end-of-iteration correction splits (Sec. 3.2); they never leave the client.
Flower keeps ``context.state`` per node across messages (in simulation it travels with every
message to whichever Ray actor runs the node; a deployed SuperNode keeps it in memory), so both
live there, each under one key, and on the node's disk when it has a ``state-dir``
(``client.state_store``), so a restarted SuperNode keeps them. Until a correction happens the
node's own labels apply.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from client.node import LocalNode
from client.state_store import load_record, save_record

LABELS_KEY = "fedcorr-labels"
LOSSES_KEY = "fedcorr-local-losses"


def current_labels(context: Context, node: LocalNode) -> np.ndarray:
    """The node's labels after every correction so far (its own labels if none happened)."""
    record = load_record(context, LABELS_KEY, node.partition_id)
    if record is None:
        return node.data.labels
    labels = record["labels"].numpy()
    if labels.shape != node.data.labels.shape:
        raise RuntimeError(
            f"client state holds {labels.shape[0]} corrected labels but the node has {len(node.data)} samples; "
            "the node's data changed during the run"
        )
    return labels


def store_labels(context: Context, node: LocalNode, labels: np.ndarray) -> None:
    """Keep ``labels`` as the node's labels for the rest of the run."""
    record = ArrayRecord({"labels": Array(np.ascontiguousarray(labels, dtype=np.int64))})
    save_record(context, LABELS_KEY, node.partition_id, record)


def store_local_losses(context: Context, node: LocalNode, losses: np.ndarray, server_round: int) -> None:
    """Keep the per-sample losses of the model trained in ``server_round`` for this iteration's correction."""
    record = ArrayRecord({"losses": Array(np.ascontiguousarray(losses, dtype=np.float32)),
                          "round": Array(np.array([server_round], dtype=np.int64))})
    save_record(context, LOSSES_KEY, node.partition_id, record)


def load_local_losses(context: Context, node: LocalNode, since_round: int) -> np.ndarray:
    """The kept local losses, which must come from training in round ``since_round`` or later.

    A client asked to split on local losses it does not have (it never trained in stage 1), or has
    only from an earlier iteration (it failed this one's training), cannot do what the paper asks:
    an error, which the server's failure policy handles, rather than a split on stale losses."""
    record = load_record(context, LOSSES_KEY, node.partition_id)
    if record is None:
        raise RuntimeError("asked for a split on local losses, but this node kept none: it has not trained "
                           "in stage 1 of this run")
    trained_in = int(record["round"].numpy()[0])
    if trained_in < since_round:
        raise RuntimeError(f"asked for a split on local losses from round {since_round} or later, but this "
                           f"node's last stage-1 training was in round {trained_in}")
    losses = record["losses"].numpy()
    if losses.shape != node.data.labels.shape:
        raise RuntimeError(f"client state holds {losses.shape[0]} local losses but the node has "
                           f"{len(node.data)} samples; the node's data changed during the run")
    return losses
