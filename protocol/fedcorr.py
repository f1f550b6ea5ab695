"""FedCorr's messages: the stage-1 train instruction (LID), its reply payload, and ``query.correct``.

- ``train`` with plug-in ``fedcorr`` and ``Stage1Ins``: after local training the client returns
  the LID score of its local model's predictions (``LidRes`` under ``fedcorr``) and, when asked,
  keeps that model's per-sample losses as its state (they never leave it).
- ``query.correct`` (arrays: the global model) with ``CorrectIns`` -> ``CorrectRes``: the client
  estimates its noise level (stage 1) and relabels, keeping the new labels as its state. Only counts
  and mu_hat leave the client; ``Diagnostics`` (ground-truth counts) only when the run asks and the
  node allows it (a simulated node, or node config ``ground-truth-diagnostics=true``).
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import MessageType

from common.validation import Checked, Interval, Options, option

PLUGIN = "fedcorr"
CORRECT = f"{MessageType.QUERY}.correct"
MODES = ("stage1", "stage2")
# Whose per-sample losses a step uses: the client's local model right after its stage-1 training, or
# the global model the correction query carries.
LOSS_MODELS = ("local", "global")
# Which samples the end-of-stage-2 correction may relabel: every one (Sec. 3.3), or only the noisy
# subset a loss GMM finds, as stage 1 does.
STAGE2_ROWS = ("all", "noisy_subset")


@dataclass(frozen=True)
class Stage1Ins(Checked):
    """Stage-1 train instruction: compute the LID score with ``lid_k`` neighbours after training; with
    ``keep_losses`` also keep the trained model's per-sample losses (client state) for the correction;
    with ``loss_share`` also return the share of the local set a 2-component GMM on those losses puts
    in its high-loss component (seeded from ``seed`` as the correction's split)."""

    lid_k: int = option(Interval(int, 1))
    keep_losses: bool = False
    loss_share: bool = False
    seed: int = 0


@dataclass(frozen=True)
class LidRes:
    """Stage-1 train reply payload: the LID score of the trained local model on the local set (eq. 2),
    and when asked its loss share (``Stage1Ins.loss_share``)."""

    lid: float
    loss_share: float | None = None


@dataclass(frozen=True)
class CorrectIns(Checked):
    """A ``query.correct`` instruction.

    mode: ``stage1`` (loss split, noise estimate, relabel the top pi of the noisy subset, eqs. 6-7) or
        ``stage2`` (relabel every confident sample, Sec. 3.3).
    pi: relabel ratio; theta: confidence threshold.
    relabel: False keeps the labels (Table 6's ablation) but still estimates mu_hat.
    split_losses: whose losses the stage-1 GMM splits (``local``: the losses the client kept after
        its stage-1 training, Sec. 3.2; ``global``: the global model's).
    rank_losses: whose losses rank D_n for the top pi (``global``: eq. (6); ``local``).
    losses_since: the first round of this stage-1 iteration; kept local losses from an earlier
        round are stale (the client did not train in this iteration) and refused.
    seed: the run's seed (the client derives its loss-GMM seed from it and its partition id).
    diagnostics: return ground-truth counts where the node knows its true labels and allows sending them.
    stage2_rows: which samples stage 2 may relabel: ``all`` (Sec. 3.3) or ``noisy_subset`` (those in
        the high-loss component of a GMM on the global model's per-sample losses).
    stage2_keep: in stage 2, a label the global model gives a probability >= stage2_keep stays (None:
        none stays for its probability, Sec. 3.3).
    """

    mode: str = option(Options(MODES))
    pi: float = option(Interval(float, 0.0, 1.0))
    theta: float = option(Interval(float, 0.0, 1.0))
    split_losses: str = option(Options(LOSS_MODELS))
    rank_losses: str = option(Options(LOSS_MODELS))
    relabel: bool = True
    losses_since: int = option(Interval(int, 0), default=0)
    seed: int = option(Interval(int, 0), default=0)
    diagnostics: bool = False
    stage2_rows: str = option(Options(STAGE2_ROWS), default="all")
    stage2_keep: float | None = option(Interval(float, 0.0, 1.0, closed="right", or_none=True), default=None)


@dataclass(frozen=True)
class Diagnostics:
    """Ground-truth counts over the samples whose true label the node knows (only from a node that
    allows them: ``client.node.sends_ground_truth``).

    known, wrong_before, wrong_after: samples with a known true label; of them, wrong before and
        after this correction. changed, changed_correct: labels changed; of them, now right.
    split_tp, split_fp, split_fn, split_tn: stage 1's sample split against the truth: flagged noisy
        and wrong, flagged but right, not flagged but wrong, not flagged and right (stage 2: None).
    confusion_before, confusion_after: the M x M counts of (true label, label held) before and
        after this correction, row-major (FedCorr Fig. 8). Counts only: never indices or labels.
    """

    known: int
    wrong_before: int
    wrong_after: int
    changed: int
    changed_correct: int
    split_tp: int | None = None
    split_fp: int | None = None
    split_fn: int | None = None
    split_tn: int | None = None
    confusion_before: tuple[int, ...] | None = None
    confusion_after: tuple[int, ...] | None = None


@dataclass(frozen=True)
class CorrectRes:
    """A ``query.correct`` reply: labels changed, the noise estimate (stage 1), diagnostics if asked."""

    n_relabeled: int
    mu_hat: float | None = None
    diagnostics: Diagnostics | None = None
