"""Counts of a client's labels against their truth, for simulation diagnostics (a real node has no
truth). Counts only leave the client: never indices or labels."""

from __future__ import annotations

import numpy as np


def split_counts(flagged: np.ndarray, wrong: np.ndarray, known: np.ndarray) -> dict[str, int]:
    """A sample split (``flagged`` noisy) against the truth, over the samples whose true label is
    ``known``: flagged and wrong, flagged but right, kept but wrong, kept and right."""
    return {"split_tp": int(np.sum(flagged & wrong)), "split_fp": int(np.sum(flagged & known & ~wrong)),
            "split_fn": int(np.sum(~flagged & wrong)), "split_tn": int(np.sum(~flagged & known & ~wrong))}
