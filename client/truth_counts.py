"""Counts of a client's labels against their truth, for ground-truth diagnostics: a simulated node
knows its true labels, a real one has none (or keeps them to itself). Counts only leave the client,
never indices or labels, and only where ``may_send_truth`` says so."""

from __future__ import annotations

import numpy as np
from flwr.app import Context

from client.node import LocalNode, sends_ground_truth


def may_send_truth(node: LocalNode, context: Context, asked: bool) -> bool:
    """Whether a reply carries ground-truth counts: the run ``asked`` (it has ground truth), the node
    allows it (``client.node.sends_ground_truth``) and knows the true label of some sample."""
    return asked and sends_ground_truth(context) and bool((node.data.true_labels >= 0).any())


def split_counts(flagged: np.ndarray, wrong: np.ndarray, known: np.ndarray) -> dict[str, int]:
    """A sample split (``flagged`` noisy) against the truth, over the samples whose true label is
    ``known``: flagged and wrong, flagged but right, kept but wrong, kept and right."""
    return {"split_tp": int(np.sum(flagged & wrong)), "split_fp": int(np.sum(flagged & known & ~wrong)),
            "split_fn": int(np.sum(~flagged & wrong)), "split_tn": int(np.sum(~flagged & known & ~wrong))}
