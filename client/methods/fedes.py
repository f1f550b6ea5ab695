"""FedES's client side: selective gradient descent (SeGD) at the rho the server sends.

Local SGD on the node's current labels with cross-entropy, every step's gradient masked and scaled
by ``task.selective_gradient``. With the static mask (D4) the client keeps, from the estimation
round, the CoP of its own update over P (client state, on disk with a ``state-dir``; it never leaves
the client) and masks the top max(1, floor(rho m)) of it in every SeGD round. The reply is the
trained weights and the usual ``TrainRes``.
"""

from __future__ import annotations

import functools

import torch
from flwr.app import Array, ArrayRecord, Context

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins import ClientMethod, Trained
from client.state_store import load_record, save_record
from client.update import local_update
from protocol.fedes import METHOD as NAME
from protocol.fedes import SeGdOptions
from protocol.messages import TrainIns
from task.selective_gradient import selective_gradient, update_criticality

COP_KEY = "fedes-cop"


def kept_criticality(context: Context, node: LocalNode) -> torch.Tensor:
    """The CoP this client kept from its last estimation round (the static mask's ranking)."""
    record = load_record(context, COP_KEY, node.partition_id)
    if record is None:
        raise RuntimeError(f"client {node.partition_id} has no CoP from an estimation round for FedES's static "
                           "mask; a node that restarts mid-run keeps it only with a state-dir")
    return torch.from_numpy(record["cop"].numpy())


def fedes_train(node: LocalNode, context: Context, arrays: ArrayRecord, ins: TrainIns,
                options: SeGdOptions) -> Trained:
    """Local SGD from the global arrays with SeGD's mask at ``options.rho``; in an estimation round
    with ``keep_cop`` the update's CoP is kept for the static mask."""
    start = arrays.to_torch_state_dict()
    fixed = kept_criticality(context, node) if options.mask == "static" and options.rho < 1.0 else None
    segd = functools.partial(selective_gradient, rho=options.rho, mask_params=options.mask_params,
                             strict_freeze=options.strict_freeze, fixed_criticality=fixed)
    model, stats = local_update(node, start, ins.training, ins.server_round,
                                labels=current_labels(context, node), schedule=ins.schedule, adjust_gradients=segd)
    if options.keep_cop:
        cop = update_criticality(model, start, options.mask_params).numpy()
        save_record(context, COP_KEY, node.partition_id, ArrayRecord({"cop": Array(cop)}))
    return Trained(model, stats)


METHOD = ClientMethod(NAME, options=SeGdOptions, train=fedes_train)
