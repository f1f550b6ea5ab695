"""FedCorr's client side: the LID score after stage-1 training, and label correction (``query.correct``).

Stage 1 (Sec. 3.2): after local training the client reports the LID score of its local model's
predictions on its local set (eq. 2) and keeps that model's per-sample losses ("every client will
compute the LID score and per-sample loss for its current local model"). When the server flags it
noisy, ``query.correct`` (stage1) fits a 2-component GMM on those local losses to find the noisy
subset D_n, estimates mu_hat = |D_n| / n_k, and relabels the top floor(pi |D_n|) of D_n by the
global model's loss (eq. 6) whose global max-probability is >= theta (eq. 7). Switches
(``CorrectIns.split_losses`` / ``rank_losses``) take either step's losses from the other model
instead. End of stage 2 (Sec. 3.3): ``query.correct`` (stage2) relabels every confident sample (with
``stage2_rows=noisy_subset`` only those a GMM on the global model's losses puts in the noisy subset;
with ``stage2_keep`` a label the global model finds that likely stays). The corrected labels and the
kept losses stay on the client (``client.label_state``, persisted with a ``state-dir``); only counts
and mu_hat leave it, and the ground-truth counts only when the run asks, the node knows its truth and
allows sending them (``client.truth_counts.may_send_truth``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Context, RecordDict

from client.label_state import current_labels, load_local_losses, store_labels, store_local_losses
from client.node import LocalNode
from client.plugins.base import ClientPlugin, QueryHandler, Trained
from client.truth_counts import may_send_truth, split_counts
from common.seeding import rng_for
from protocol.fedcorr import PLUGIN, CorrectIns, CorrectRes, Diagnostics, LidRes, Stage1Ins
from protocol.messages import TrainIns, read_arrays, read_instruction, reply
from task.correction import loss_split, stage1_relabel, stage2_relabel
from task.evaluation import loss_and_proba
from task.lid import lid_score


def confusion(truth: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[int, ...]:
    """The M x M counts of (true label, label held), row-major, over the samples whose truth is known."""
    known = truth >= 0
    counts = np.bincount(truth[known] * num_classes + labels[known], minlength=num_classes * num_classes)
    return tuple(int(count) for count in counts)


def diagnostics(node: LocalNode, before: np.ndarray, after: np.ndarray,
                noisy: np.ndarray | None = None) -> Diagnostics:
    """Ground-truth label noise before/after, how many changed labels became right, the sample
    split against the truth (stage 1: ``noisy`` is D_n's mask) and the confusion counts. Only a node
    that knows its true labels (simulation, rehearsal) can compute them, and sends them only where
    ``client.truth_counts.may_send_truth`` allows; a real node has none."""
    truth = node.data.true_labels
    known = truth >= 0
    changed = known & (before != after)
    wrong = known & (before != truth)
    split = split_counts(noisy, wrong, known) if noisy is not None else {}
    classes = node.dataset.num_classes
    return Diagnostics(
        known=int(known.sum()),
        wrong_before=int(wrong.sum()),
        wrong_after=int(np.sum(known & (after != truth))),
        changed=int(changed.sum()),
        changed_correct=int(np.sum(changed & (after == truth))),
        confusion_before=confusion(truth, before, classes),
        confusion_after=confusion(truth, after, classes),
        **split,
    )


def loss_gmm_seed(seed: int, node: LocalNode) -> int:
    """The random_state of the client's loss GMMs: from the run's seed and its partition id."""
    return int(rng_for(seed, f"loss-gmm/{node.partition_id}").integers(2**31))


def correct(node: LocalNode, context: Context, content: RecordDict) -> RecordDict:
    """FedCorr's label correction (Sec. 3.2 steps 2-3, Sec. 3.3): new labels from the global model."""
    ins = read_instruction(content, CorrectIns)
    model = node.new_model()
    model.load_state_dict(read_arrays(content, "the server").to_torch_state_dict())
    labels = current_labels(context, node)
    losses, probabilities = loss_and_proba(model, node.data.images, labels, node.eval_transform, device=node.device)
    mu_hat, noisy = None, None
    seed = loss_gmm_seed(ins.seed, node)
    if ins.mode == "stage1":
        def losses_of(model_name: str) -> np.ndarray:
            if model_name == "global":
                return losses
            return load_local_losses(context, node, since_round=ins.losses_since)

        noisy = loss_split(losses_of(ins.split_losses), seed)
        new, mu_hat, _ = stage1_relabel(labels, losses_of(ins.rank_losses), probabilities, noisy,
                                        pi=ins.pi, theta=ins.theta)
    else:
        if ins.stage2_rows == "noisy_subset":
            noisy = loss_split(losses, seed)
        new, _ = stage2_relabel(labels, probabilities, theta=ins.theta, rows=noisy, keep=ins.stage2_keep)
    if not ins.relabel:
        new = labels
    store_labels(context, node, new)
    counts = diagnostics(node, labels, new, noisy) if may_send_truth(node, context, ins.diagnostics) else None
    return reply(CorrectRes(n_relabeled=int(np.sum(new != labels)), mu_hat=mu_hat, diagnostics=counts))


class FedCorrPlugin(ClientPlugin):
    """Stage-1 training with the LID score, and ``query.correct``."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Local training (mixup and the proximal term come in ``ins.training``), then the LID score of
        the trained model's softmax outputs on the local set (evaluation transforms); when the
        instruction asks, the same pass's per-sample losses on the current labels are kept."""
        stage1 = self.instruction(content, Stage1Ins)
        trained = super().train(node, context, ins, content)
        losses, probabilities = loss_and_proba(trained.model, node.data.images, current_labels(context, node),
                                               node.eval_transform, device=node.device)
        if stage1.keep_losses:
            store_local_losses(context, node, losses, ins.server_round)
        share = float(loss_split(losses, loss_gmm_seed(stage1.seed, node)).mean()) if stage1.loss_share else None
        return Trained(trained.model, trained.stats, LidRes(lid_score(probabilities, k=stage1.lid_k), share))

    def queries(self) -> Mapping[str, QueryHandler]:
        """``query.correct``: label correction."""
        return {"correct": correct}
