"""FedDiv's client side (Li et al., AAAI 2024, Sec. 3.3; ``docs/feddiv.md``).

Warm-up: mixup training (+ eta L_reg) on every sample. Main phase, each round:
1. the received global model's per-sample losses on the given labels, min-max normalised;
2. the global filter's clean posterior splits the samples (>= 0.5 clean); delta_hat = noisy share;
   without a global filter yet, a fresh local mixture (or a fixed filter) stands in; with
   ``balanced_split`` (beyond the paper and the code) every given label keeps the client's clean share;
3. a client with delta_hat < 0.1 trains on all its samples; otherwise noisy samples on which the
   global model is confident (max-probability >= zeta) take its label and the rest are dropped, and
   before every local epoch the predictive-consistency sampler keeps the candidates whose global
   prediction equals the local model's de-biased one (``task.consistency``);
4. training: mixup + eta L_reg (``task.learners.uniform_prior``);
5. the local prior p_hat moves toward the trained model's mean prediction (client state);
6. the local filter: EM from the global filter on the trained model's normalised losses.
Relabels are not kept: each round starts again from the given labels. The released code's choices
are switches (``protocol.feddiv.FedDivClientSettings``, docs/feddiv.md). Client state, kept with the node's
other state (on disk with a ``state-dir``): p_hat (C floats), the main-phase participation count and,
with ``pcs_mode=cached``, the de-biased labels of the previous participation. What leaves the client
beyond weights: the local filter (6 floats), delta_hat and two counts; ground-truth counts only when
the run asks and the node allows it (``client.truth_counts.may_send_truth``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, RecordDict

from client.label_state import current_labels
from client.node import LocalNode
from client.plugins.base import ClientPlugin, Trained
from client.state_store import load_record, save_record
from client.truth_counts import may_send_truth, split_counts
from client.update import local_update
from common.seeding import rng_for
from protocol.feddiv import PLUGIN, Diagnostics, FedDivClientSettings, FedDivIns, FedDivRes
from protocol.messages import SERVER, TrainIns, read_arrays
from task.consistency import consistent, debiased_labels, updated_prior
from task.evaluation import augmented_logits, per_sample_losses, predict_logits
from task.hooks import TrainingHooks
from task.learner_settings import LearnerSchedule
from task.learners import Learner
from task.learners.uniform_prior import MixupUniformPrior
from task.local_training import LocalTraining
from task.noise_filter import FIXED_FILTER, NoiseFilter, clean_posterior, fit_filter, min_max, random_filter

STATE_KEY = "feddiv-state"
# The released code's selection rules (``pcs_code_rules``): no relabelling or consistency
# sampling before a client's 5th main-phase participation, and clean samples only up to delta_hat 0.2.
CODE_RULE_PARTICIPATIONS = 5
CODE_RULE_CLEAN_ONLY = 0.2


@dataclass
class ClientState:
    """What a FedDiv client keeps between participations.

    prior: p_hat, uniform before the first main-phase round. participations: main-phase rounds done.
    debiased: the de-biased labels of the last trained model (``pcs_mode=cached`` only), else None.
    """

    prior: np.ndarray
    participations: int = 0
    debiased: np.ndarray | None = None


def load_state(context: Context, node: LocalNode) -> ClientState:
    """The client's kept state, or a fresh one before its first main-phase round."""
    record = load_record(context, STATE_KEY, node.partition_id)
    classes = node.dataset.num_classes
    if record is None:
        return ClientState(np.full(classes, 1.0 / classes))
    prior = record["prior"].numpy()
    if prior.shape != (classes,):
        raise RuntimeError(f"client state holds a FedDiv prior of shape {prior.shape}; the run has {classes} classes")
    debiased = record["debiased"].numpy() if "debiased" in record else None
    return ClientState(prior, int(record["participations"].numpy()[0]), debiased)


def store_state(context: Context, node: LocalNode, state: ClientState) -> None:
    """Keep the state for the client's next participation."""
    arrays = {"prior": Array(np.ascontiguousarray(state.prior, dtype=np.float64)),
              "participations": Array(np.array([state.participations], dtype=np.int64))}
    if state.debiased is not None:
        arrays["debiased"] = Array(np.ascontiguousarray(state.debiased, dtype=np.int64))
    save_record(context, STATE_KEY, node.partition_id, ArrayRecord(arrays))


def _mixture_seed(feddiv: FedDivIns, node: LocalNode | None, server_round: int, purpose: str) -> int:
    # The code's random start is one filter for every client: its seed names no client.
    client = "" if node is None else f"/{node.partition_id}"
    return int(rng_for(feddiv.seed, f"feddiv-{purpose}/{server_round}{client}").integers(2**31))


def _logits(model: torch.nn.Module, node: LocalNode) -> torch.Tensor:
    return predict_logits(model, node.data.images, node.eval_transform, device=node.device)


def filter_losses(logits: torch.Tensor, labels: np.ndarray, kind: str) -> np.ndarray:
    """The min-max normalised per-sample losses a filter is fitted to or splits with: cross-entropy
    of the logits (``ce``), or of the softmax outputs taken as logits (``softmax_ce``: bounded, so one
    confidently wrong sample cannot squeeze every other loss toward 0)."""
    scores = torch.softmax(logits, dim=1) if kind == "softmax_ce" else logits
    return min_max(per_sample_losses(scores, labels))


def _scored_losses(model: torch.nn.Module, logits: torch.Tensor, node: LocalNode, labels: np.ndarray,
                   params: FedDivClientSettings, server_round: int, purpose: str) -> np.ndarray:
    """The filter's losses of ``model`` (whose evaluation logits are ``logits``)."""
    if params.filter_transform == "train":
        logits = augmented_logits(model, node.data.images, node.train_transform,
                                  node.generator(server_round, f"feddiv-{purpose}"), device=node.device)
    return filter_losses(logits, labels, params.filter_loss)


def _splitting_filter(feddiv: FedDivIns, node: LocalNode, server_round: int,
                      normalised: np.ndarray) -> NoiseFilter:
    """The filter this round's split uses: the global one, or a stand-in (``filter_init``, or every
    round under ``filter_scope=local``)."""
    params = feddiv.params
    if params.filter_scope != "local":
        if feddiv.filter is not None:
            return feddiv.filter
        if params.filter_init == "fixed":
            return FIXED_FILTER
        if params.filter_init == "code_random":
            return random_filter(_mixture_seed(feddiv, None, server_round, "random"))
    return fit_filter(normalised, _mixture_seed(feddiv, node, server_round, "bootstrap"))


@dataclass(frozen=True)
class Selection:
    """A round's candidates: the training labels, which samples were relabelled, the candidate
    rows, and whether the consistency sampler filters them."""

    train_labels: np.ndarray
    relabeled: np.ndarray
    candidates: np.ndarray
    sampler: bool


def noise_share(clean: np.ndarray) -> float:
    """delta_hat: the share of the client's samples the filter flags noisy, computed from the noisy ones
    (1 - the clean share would put 1 noisy sample in 10 at 0.09999999999999998, below a 0.1 bar)."""
    return float((~clean).mean())


def balanced(clean: np.ndarray, losses: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The split with the client's clean share in every given label (``balanced_split``): as many clean
    samples as ``clean`` holds, each label's quota its share of them (the largest remainders rounded up,
    ties to the smaller label), filled with the label's samples of smallest filter loss. A class the
    global model confuses is then not flagged noisy wholesale, nor relabelled to its neighbour."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * clean.mean()
    quotas = np.floor(exact).astype(int)
    short = int(clean.sum()) - int(quotas.sum())
    quotas[np.argsort(-(exact - quotas), kind="stable")[:short]] += 1
    out = np.zeros(len(labels), dtype=bool)
    for label, quota in zip(classes, quotas):
        rows = np.flatnonzero(labels == label)
        out[rows[np.argsort(losses[rows], kind="stable")[:quota]]] = True
    return out


def select(params: FedDivClientSettings, labels: np.ndarray, clean: np.ndarray, probabilities: np.ndarray,
           participations: int) -> Selection:
    """Eq. 11's candidates: all samples for a clean client (delta_hat below ``clean_client``); else
    the clean ones plus the noisy ones the global model is confident about (>= zeta), relabelled with
    its prediction. Under ``pcs_code_rules`` a noisy client trains on its clean samples only until its
    5th main-phase participation, and keeps no relabelled ones while delta_hat <= 0.2."""
    noise_estimate = noise_share(clean)
    relabeled = np.zeros(len(labels), dtype=bool)
    train_labels = labels.copy()
    if noise_estimate < params.clean_client:
        return Selection(train_labels, relabeled, np.arange(len(labels)), sampler=False)
    if params.pcs_code_rules and participations < CODE_RULE_PARTICIPATIONS:
        return Selection(train_labels, relabeled, np.flatnonzero(clean), sampler=False)
    if params.relabel and not (params.pcs_code_rules and noise_estimate <= CODE_RULE_CLEAN_ONLY):
        relabeled = ~clean & (probabilities.max(axis=1) >= params.zeta)
        global_labels = probabilities.argmax(axis=1)
        train_labels[relabeled] = global_labels[relabeled]
    return Selection(train_labels, relabeled, np.flatnonzero(clean | relabeled), sampler=params.pcs)


@dataclass
class ConsistencySampler:
    """The main phase's rows: before every local epoch, the candidates whose global prediction equals
    the local model's de-biased one (``task.consistency``); ``trained`` holds the last epoch's rows."""

    selection: Selection
    params: FedDivClientSettings
    kept: ClientState
    global_logits: torch.Tensor
    global_labels: np.ndarray
    node: LocalNode

    def __post_init__(self) -> None:
        self.trained = self.selection.candidates

    def rows(self, epoch: int, model: torch.nn.Module) -> torch.Tensor:
        """The rows epoch ``epoch`` trains on, chosen with the model being trained."""
        rows, params, kept = self.selection.candidates, self.params, self.kept
        if self.selection.sampler:
            if params.pcs_mode == "cached" and kept.debiased is not None:
                local = kept.debiased
            else:
                # The first epoch's local model is still the global one, whose logits are known; the
                # cached sampler without labels from an earlier participation uses them too.
                fresh = epoch == 0 or params.pcs_mode == "cached"
                local = debiased_labels(self.global_logits if fresh else _logits(model, self.node), kept.prior,
                                        params.xi)
            rows = consistent(rows, self.global_labels, local)
        self.trained = rows
        return torch.from_numpy(rows)


class FedDivHooks(TrainingHooks):
    """FedDiv's objective, mixup + eta L_reg (plain cross-entropy + L_reg in a ``ce`` warm-up), on every
    row, or on the rows of a ``ConsistencySampler``."""

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule, ins: FedDivIns,
                 sampler: ConsistencySampler | None = None) -> None:
        super().__init__(training, schedule)
        self.ins, self.sampler = ins, sampler

    def learner(self, model: torch.nn.Module, generator: torch.Generator) -> Learner:
        """Mixup with the uniform-prior regulariser."""
        params = self.ins.params
        alpha = 0.0 if self.ins.phase == "warmup" and params.warmup_loss == "ce" else params.mixup_alpha
        return MixupUniformPrior(alpha, self.ins.eta, generator, extra_forward=params.bn_extra_pass)

    def epoch_rows(self, epoch: int, model: torch.nn.Module) -> torch.Tensor | None:
        """The sampler's rows (None in the warm-up: every row)."""
        return None if self.sampler is None else self.sampler.rows(epoch, model)


class FedDivPlugin(ClientPlugin):
    """A warm-up or main-phase round of FedDiv's local work (see the module's docstring)."""

    name = PLUGIN

    def train(self, node: LocalNode, context: Context, ins: TrainIns, content: RecordDict) -> Trained:
        """Warm-up: train on every sample. Main phase: split with the global filter, select, train on the
        consistent rows, move the prior and fit the local filter."""
        feddiv = self.instruction(content, FedDivIns)
        state = read_arrays(content, SERVER).to_torch_state_dict()
        labels = current_labels(context, node)
        if feddiv.phase == "warmup":
            model, stats = local_update(node, state, FedDivHooks(ins.training, ins.schedule, feddiv),
                                        ins.server_round, labels=labels)
            return Trained(model, stats)

        params, server_round = feddiv.params, ins.server_round
        global_model = node.model_for_state(state.keys())
        global_model.load_state_dict(state)
        global_logits = _logits(global_model, node)
        probabilities = torch.softmax(global_logits, dim=1).numpy()
        normalised = _scored_losses(global_model, global_logits, node, labels, params, server_round, "global")
        start = _splitting_filter(feddiv, node, server_round, normalised)
        clean = clean_posterior(normalised, start) >= 0.5
        if params.balanced_split:
            clean = balanced(clean, normalised, labels)
        kept = load_state(context, node)
        chosen = select(params, labels, clean, probabilities, kept.participations)
        sampler = ConsistencySampler(chosen, params, kept, global_logits, probabilities.argmax(axis=1), node)
        model, stats = local_update(node, state, FedDivHooks(ins.training, ins.schedule, feddiv, sampler),
                                    server_round, labels=chosen.train_labels)
        local_logits = _logits(model, node)
        store_state(context, node, ClientState(
            prior=updated_prior(kept.prior, local_logits, params.momentum, params.xi, params.prior_confidence),
            participations=kept.participations + 1,
            # The code caches labels de-biased with the prior before this round's update.
            debiased=debiased_labels(local_logits, kept.prior, params.xi) if params.pcs_mode == "cached" else None))
        local_filter = fit_filter(_scored_losses(model, local_logits, node, labels, params, server_round, "local"),
                                  _mixture_seed(feddiv, node, server_round, "filter"), start=start,
                                  max_iterations=params.em_iters)
        counts = None
        if may_send_truth(node, context, feddiv.diagnostics):
            counts = diagnostics(node.data.true_labels, labels, clean, chosen.relabeled, chosen.train_labels,
                                 sampler.trained, node.dataset.num_classes)
        report = FedDivRes(filter=local_filter, noise_estimate=noise_share(clean),
                           relabeled=int(chosen.relabeled.sum()), trained=int(len(sampler.trained)),
                           diagnostics=counts)
        return Trained(model, stats, report)


def diagnostics(truth: np.ndarray, labels: np.ndarray, clean: np.ndarray, relabeled: np.ndarray,
                train_labels: np.ndarray, trained: np.ndarray, num_classes: int) -> Diagnostics:
    """The round's split, relabelling and training set against the true labels (where known), in
    all and per true class (counts only)."""
    known = truth >= 0
    wrong = known & (labels != truth)
    trained_mask = np.zeros(len(labels), dtype=bool)
    trained_mask[trained] = True
    trained_wrong = trained_mask & known & (train_labels != truth)

    def per_class(mask: np.ndarray) -> tuple[int, ...]:
        return tuple(int(c) for c in np.bincount(truth[mask & known], minlength=num_classes))

    return Diagnostics(
        known=int(known.sum()), wrong=int(wrong.sum()), **split_counts(~clean, wrong, known),
        relabeled_correct=int(np.sum(relabeled & known & (train_labels == truth))),
        trained_wrong=int(trained_wrong.sum()), class_known=per_class(known),
        class_trained=per_class(trained_mask), class_trained_wrong=per_class(trained_wrong),
    )

