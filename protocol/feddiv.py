"""FedDiv's messages: the train options (with the global noise filter) and the reply extra (the
client's local filter and its counts).

``train`` with method ``feddiv`` and ``FedDivOptions``: in the warm-up the client trains on all its
samples; in the main phase it splits its samples with the global filter, relabels confident noisy
ones, keeps the predictively consistent ones and trains on them, then fits its local filter. The
reply's ``FedDivReport`` (under ``feddiv``) carries the local filter (6 floats), the estimated noise
level and counts; ``Diagnostics`` (ground-truth counts) only in simulation. Never per-sample values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.validation import Choice, Flag, Integer, Nullable, Number, check_fields, rule
from protocol.codec import NAMESPACED
from task.noise_filter import NoiseFilter

METHOD = "feddiv"
PHASES = ("warmup", "main")
# Without a global filter yet (the first main round): fit a fresh local 2-component mixture
# (``local_bootstrap``), start from ``task.noise_filter.FIXED_FILTER`` (``fixed``), or from a mixture
# fitted to uniform random numbers (``code_random``, the released code's).
FILTER_INITS = ("local_bootstrap", "fixed", "code_random")
WARMUP_LOSSES = ("mixup", "ce")
# The loss the filter sees (C4): cross-entropy of the logits (the paper), or of the softmax outputs
# taken as logits (``softmax_ce``, the released code's double softmax).
FILTER_LOSSES = ("ce", "softmax_ce")
# The images the filter's losses are scored on: the evaluation transform, or one random draw of the
# training augmentation (the released code).
FILTER_TRANSFORMS = ("eval", "train")
# Which filter splits a client's samples (Table 5): the global one over every client seen (``all``),
# over this round's clients only (``round``, "degraded"), or the client's own mixture fitted afresh to
# the received model's losses (``local``).
FILTER_SCOPES = ("all", "round", "local")
# When the consistency sampler re-selects: before every local epoch with the model being trained
# (``epoch``, the paper), or once per round from de-biased labels kept since the client's previous
# participation (``cached``, the released code).
PCS_MODES = ("epoch", "cached")


@dataclass(frozen=True)
class FedDivParams:
    """FedDiv's client-side hyperparameters (the same every round; ``conf/strategy/feddiv.yaml``).

    zeta: relabel a noisy sample whose global max-probability is >= zeta (0.75).
    xi: the de-biasing strength of the predictive-consistency sampler (0.5).
    momentum: m of the local class prior's moving average (0.2).
    mixup_alpha: mixup's Beta(alpha, alpha) (1).
    clean_client: a client whose estimated noise level is below this trains on all its labels (0.1).
    em_iters: EM iterations of the local filter (None: to convergence, tol 1e-3, at most 100).
    prior_confidence: None averages the local prior over every sample (eq. 12); a number averages
        only samples whose de-biased max-probability exceeds it (the released code: 0.85).
    relabel, pcs: Table 5's ablations (False: no relabelling; no consistency sampler).
    warmup_loss: ``mixup`` (main text) | ``ce`` (the supplement).
    filter_init: ``local_bootstrap`` | ``fixed`` | ``code_random`` (``FILTER_INITS``).
    filter_loss: ``ce`` | ``softmax_ce``; filter_transform: ``eval`` | ``train`` (C4).
    filter_scope: ``all`` | ``round`` | ``local`` (``FILTER_SCOPES``; Table 5's filter ablations).
    pcs_mode: ``epoch`` | ``cached`` (``PCS_MODES``, C6).
    pcs_code_rules: the released code's selection rules (C7): until a client's 5th main-phase
        participation it trains on its clean samples only; with delta_hat <= 0.2 on its consistent
        clean samples only; above, as the paper.
    bn_extra_pass: the released code's unused forward pass of each un-mixed batch in training mode,
        which moves batch-norm statistics (C13).
    """

    zeta: float = field(default=0.75, metadata=rule(Number(low=0.0, high=1.0)))
    xi: float = field(default=0.5, metadata=rule(Number(low=0.0)))
    momentum: float = field(default=0.2, metadata=rule(Number(low=0.0, high=1.0)))
    mixup_alpha: float = field(default=1.0, metadata=rule(Number(low=0.0)))
    clean_client: float = field(default=0.1, metadata=rule(Number(low=0.0, high=1.0)))
    em_iters: int | None = field(default=None, metadata=rule(Nullable(Integer(low=1))))
    prior_confidence: float | None = field(default=None, metadata=rule(Nullable(Number(low=0.0, high=1.0))))
    relabel: bool = field(default=True, metadata=rule(Flag()))
    pcs: bool = field(default=True, metadata=rule(Flag()))
    warmup_loss: str = field(default="mixup", metadata=rule(Choice(WARMUP_LOSSES)))
    filter_init: str = field(default="local_bootstrap", metadata=rule(Choice(FILTER_INITS)))
    filter_loss: str = field(default="ce", metadata=rule(Choice(FILTER_LOSSES)))
    filter_transform: str = field(default="eval", metadata=rule(Choice(FILTER_TRANSFORMS)))
    filter_scope: str = field(default="all", metadata=rule(Choice(FILTER_SCOPES)))
    pcs_mode: str = field(default="epoch", metadata=rule(Choice(PCS_MODES)))
    pcs_code_rules: bool = field(default=False, metadata=rule(Flag()))
    bn_extra_pass: bool = field(default=False, metadata=rule(Flag()))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class FedDivOptions:
    """What a FedDiv client does this round.

    phase: ``warmup`` (train on everything, no filter) | ``main``.
    params: the run's hyperparameters.
    eta: weight of the uniform-prior regulariser (1 non-IID, 0 IID).
    filter: the global noise filter (None: none yet, see ``FedDivParams.filter_init``).
    seed: the run's seed (the client derives its mixture seeds from it).
    diagnostics: return ground-truth counts where the node knows its true labels (simulation).
    """

    phase: str = field(metadata=rule(Choice(PHASES)))
    params: FedDivParams = field(default_factory=FedDivParams)
    eta: float = field(default=0.0, metadata=rule(Number(low=0.0)))
    filter: NoiseFilter | None = field(default=None, metadata={NAMESPACED: True})
    seed: int = field(default=0, metadata=rule(Integer(low=0)))
    diagnostics: bool = False

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Diagnostics:
    """Ground-truth counts of one main-phase round (simulation only).

    known: samples with a known true label; wrong: of them, given a wrong label.
    split_tp, split_fp, split_fn, split_tn: the filter's split against the truth (flagged noisy and
        wrong, flagged but right, kept clean but wrong, kept clean and right).
    relabeled_correct: relabelled samples whose new label is the true one.
    trained_wrong: samples of the last epoch's training set whose training label is wrong.
    class_known, class_trained, class_trained_wrong: per true class (C counts each), the samples
        with a known true label, those in the last epoch's training set, and of those the ones whose
        training label is wrong: which classes the selection keeps and which it mislabels.
    """

    known: int
    wrong: int
    split_tp: int
    split_fp: int
    split_fn: int
    split_tn: int
    relabeled_correct: int
    trained_wrong: int
    class_known: tuple[int, ...] = ()
    class_trained: tuple[int, ...] = ()
    class_trained_wrong: tuple[int, ...] = ()


@dataclass(frozen=True)
class FedDivReport:
    """A main-phase ``train`` reply's extra.

    filter: the client's local filter, fitted on its trained model's losses.
    noise_estimate: delta_hat, the share of samples the global filter flagged noisy.
    relabeled: samples given the global model's label; trained: samples in the last epoch.
    """

    filter: NoiseFilter
    noise_estimate: float
    relabeled: int
    trained: int
    diagnostics: Diagnostics | None = None
