"""The labels a client trains on, kept as client state across rounds.

FedCorr relabels samples on the client; the corrected labels must outlive the message that made
them. Flower keeps ``context.state`` per node across messages (in simulation it travels with every
message to whichever Ray actor runs the node; a deployed SuperNode keeps it in memory), so the
corrected labels live there under one key, and on the node's disk when it has a ``state-dir``
(``client.state_store``), so a restarted SuperNode keeps them. Until a correction happens the
node's own labels apply.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from client.node import LocalNode
from client.state_store import load_record, save_record

LABELS_KEY = "fedcorr-labels"


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
