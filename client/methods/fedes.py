"""FedES's client side: selective gradient descent (SeGD) at the rho the server sends.

Local SGD on the node's current labels with cross-entropy, every step's gradient masked and scaled
by ``task.selective_gradient``. No client state: rho arrives with every message, and the reply is
the trained weights and the usual ``TrainRes``.
"""

from __future__ import annotations

import functools

from flwr.app import ArrayRecord, Context

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins import ClientMethod, Trained
from client.update import local_update
from protocol.fedes import METHOD as NAME
from protocol.fedes import SeGdOptions
from protocol.messages import TrainIns
from task.selective_gradient import selective_gradient


def fedes_train(node: LocalNode, context: Context, arrays: ArrayRecord, ins: TrainIns,
                options: SeGdOptions) -> Trained:
    """Local SGD from the global arrays with SeGD's mask at ``options.rho``."""
    segd = functools.partial(selective_gradient, rho=options.rho, mask_params=options.mask_params,
                             strict_freeze=options.strict_freeze)
    model, stats = local_update(node, arrays.to_torch_state_dict(), ins.training, ins.server_round,
                                labels=current_labels(context, node), schedule=ins.schedule, adjust_gradients=segd)
    return Trained(model, stats)


METHOD = ClientMethod(NAME, options=SeGdOptions, train=fedes_train)
