"""The labels a client trains on, kept as client state across rounds.

FedCorr relabels samples on the client; the corrected labels must outlive the message that made
them. Flower keeps ``context.state`` per node across messages (in simulation it travels with every
message to whichever Ray actor runs the node; a deployed SuperNode keeps it in memory), so the
corrected labels live there under one key. Until a correction happens the node's own labels apply.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from client.node import LocalNode

LABELS_KEY = "fedcorr-labels"


def current_labels(context: Context, node: LocalNode) -> np.ndarray:
    """The node's labels after every correction so far (its own labels if none happened)."""
    if LABELS_KEY not in context.state.array_records:
        return node.data.labels
    labels = context.state.array_records[LABELS_KEY]["labels"].numpy()
    if labels.shape != node.data.labels.shape:
        raise RuntimeError(
            f"client state holds {labels.shape[0]} corrected labels but the node has {len(node.data)} samples; "
            "the node's data changed during the run"
        )
    return labels


def store_labels(context: Context, labels: np.ndarray) -> None:
    """Keep ``labels`` as the node's labels for the rest of the run."""
    context.state[LABELS_KEY] = ArrayRecord({"labels": Array(np.ascontiguousarray(labels, dtype=np.int64))})
