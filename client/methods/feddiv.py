"""FedDiv's client side (Li et al., AAAI 2024, Sec. 3.3; ``../shared/methods.md`` section 3.3).

Warm-up: mixup training (+ eta L_reg) on every sample. Main phase, each round:
1. the received global model's per-sample losses on the given labels, min-max normalised;
2. the global filter's clean posterior splits the samples (>= 0.5 clean); delta_hat = noisy share;
   without a global filter yet, a fresh local mixture (or a fixed filter) stands in;
3. a client with delta_hat < 0.1 trains on all its samples; otherwise noisy samples on which the
   global model is confident (max-probability >= zeta) take its label and the rest are dropped, and
   before every local epoch the predictive-consistency sampler keeps the candidates whose global
   prediction equals the local model's de-biased one (``task.consistency``);
4. training: mixup + eta L_reg (``task.learners.uniform_prior``);
5. the local prior p_hat moves toward the trained model's mean prediction (client state);
6. the local filter: EM from the global filter on the trained model's normalised losses.
Relabels are not kept: each round starts again from the given labels. p_hat (C floats) is the only
client state, kept with the node's other state (on disk with a ``state-dir``). What leaves the
client beyond weights: the local filter (6 floats), delta_hat and two counts; ground-truth counts in
simulation only.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins import ClientMethod, Trained
from client.state_store import load_record, save_record
from client.truth_counts import split_counts
from client.update import local_update
from common.seeding import rng_for
from protocol.feddiv import METHOD as NAME
from protocol.feddiv import Diagnostics, FedDivOptions, FedDivReport
from protocol.messages import TrainIns
from task.consistency import consistent, debiased_labels, updated_prior
from task.evaluation import per_sample_losses, predict_logits
from task.learners.uniform_prior import MixupUniformPrior
from task.noise_filter import FIXED_FILTER, clean_posterior, fit_filter, min_max

PRIOR_KEY = "feddiv-prior"


def load_prior(context: Context, node: LocalNode) -> np.ndarray:
    """p_hat: the kept local prior, uniform before the client's first main-phase round."""
    record = load_record(context, PRIOR_KEY, node.partition_id)
    classes = node.dataset.num_classes
    if record is None:
        return np.full(classes, 1.0 / classes)
    prior = record["prior"].numpy()
    if prior.shape != (classes,):
        raise RuntimeError(f"client state holds a FedDiv prior of shape {prior.shape}; the run has {classes} classes")
    return prior


def store_prior(context: Context, node: LocalNode, prior: np.ndarray) -> None:
    """Keep p_hat for the client's next participation."""
    save_record(context, PRIOR_KEY, node.partition_id,
                ArrayRecord({"prior": Array(np.ascontiguousarray(prior, dtype=np.float64))}))


def _mixture_seed(options: FedDivOptions, node: LocalNode, server_round: int, purpose: str) -> int:
    return int(rng_for(options.seed, f"feddiv-{purpose}/{server_round}/{node.partition_id}").integers(2**31))


def _logits(model: torch.nn.Module, node: LocalNode) -> torch.Tensor:
    return predict_logits(model, node.data.images, node.eval_transform, device=node.device)


def feddiv_train(node: LocalNode, context: Context, arrays: ArrayRecord, ins: TrainIns,
                 options: FedDivOptions) -> Trained:
    """A warm-up or main-phase round of FedDiv's local work (see the module's docstring)."""
    state = arrays.to_torch_state_dict()
    labels = current_labels(context, node)
    params = options.params
    warmup = options.phase == "warmup"
    alpha = 0.0 if warmup and params.warmup_loss == "ce" else params.mixup_alpha

    def learner(model: torch.nn.Module, generator: torch.Generator) -> MixupUniformPrior:
        return MixupUniformPrior(alpha, options.eta, generator)

    if warmup:
        model, stats = local_update(node, state, ins.training, ins.server_round, labels=labels, learner=learner)
        return Trained(model, stats)

    global_model = node.model_for_state(state.keys())
    global_model.load_state_dict(state)
    global_logits = _logits(global_model, node)
    probabilities = torch.softmax(global_logits, dim=1).numpy()
    global_labels = probabilities.argmax(axis=1)
    normalised = min_max(per_sample_losses(global_logits, labels))
    start = options.filter
    if start is None:
        start = (FIXED_FILTER if params.filter_init == "fixed"
                 else fit_filter(normalised, _mixture_seed(options, node, ins.server_round, "bootstrap")))
    clean = clean_posterior(normalised, start) >= 0.5
    noise_estimate = float(1.0 - clean.mean())

    train_labels = labels.copy()
    relabeled = np.zeros(len(labels), dtype=bool)
    sampler = params.pcs and noise_estimate >= params.clean_client
    if noise_estimate >= params.clean_client:
        if params.relabel:
            relabeled = ~clean & (probabilities.max(axis=1) >= params.zeta)
            train_labels[relabeled] = global_labels[relabeled]
        candidates = np.flatnonzero(clean | relabeled)
    else:
        candidates = np.arange(len(labels))
    prior = load_prior(context, node)
    trained_rows = [candidates]

    def epoch_rows(epoch: int, model: torch.nn.Module) -> torch.Tensor:
        rows = candidates
        if sampler:
            # In the first epoch the local model is still the global one: its logits are known.
            logits = global_logits if epoch == 0 else _logits(model, node)
            rows = consistent(candidates, global_labels, debiased_labels(logits, prior, params.xi))
        trained_rows[0] = rows
        return torch.from_numpy(rows)

    model, stats = local_update(node, state, ins.training, ins.server_round, labels=train_labels,
                                learner=learner, epoch_rows=epoch_rows)
    local_logits = _logits(model, node)
    store_prior(context, node, updated_prior(prior, local_logits, params.momentum, params.xi,
                                             params.prior_confidence))
    local_filter = fit_filter(min_max(per_sample_losses(local_logits, labels)),
                              _mixture_seed(options, node, ins.server_round, "filter"), start=start,
                              max_iterations=params.em_iters)
    counts = None
    if options.diagnostics and (node.data.true_labels >= 0).any():
        counts = diagnostics(node.data.true_labels, labels, clean, relabeled, train_labels, trained_rows[0])
    report = FedDivReport(filter=local_filter, noise_estimate=noise_estimate, relabeled=int(relabeled.sum()),
                          trained=int(len(trained_rows[0])), diagnostics=counts)
    return Trained(model, stats, report)


def diagnostics(truth: np.ndarray, labels: np.ndarray, clean: np.ndarray, relabeled: np.ndarray,
                train_labels: np.ndarray, trained: np.ndarray) -> Diagnostics:
    """The round's split, relabelling and training set against the true labels (where known)."""
    known = truth >= 0
    wrong = known & (labels != truth)
    trained_mask = np.zeros(len(labels), dtype=bool)
    trained_mask[trained] = True
    return Diagnostics(
        known=int(known.sum()), wrong=int(wrong.sum()), **split_counts(~clean, wrong, known),
        relabeled_correct=int(np.sum(relabeled & known & (train_labels == truth))),
        trained_wrong=int(np.sum(trained_mask & known & (train_labels != truth))),
    )


METHOD = ClientMethod(NAME, options=FedDivOptions, train=feddiv_train)
