"""FedDiv's messages: the train instruction (with the global noise filter) and the reply payload
(the client's local filter and its counts).

``train`` with plug-in ``feddiv`` and ``FedDivIns``: in the warm-up the client trains on all its
samples; in the main phase it splits its samples with the global filter, relabels confident noisy
ones, keeps the predictively consistent ones and trains on them, then fits its local filter. The
reply's ``FedDivRes`` (under ``feddiv``) carries the local filter (6 floats), the estimated noise
level and counts; ``Diagnostics`` (ground-truth counts) only from a node that allows them (a simulated
node, or node config ``ground-truth-diagnostics=true``). Never per-sample values.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.validation import Checked, Flag, Interval, Options, option
from task.noise_filter import NoiseFilter

PLUGIN = "feddiv"
PHASES = ("warmup", "main")
# Without a global filter yet (the first main round): fit a fresh local 2-component mixture
# (``local_bootstrap``), start from ``task.noise_filter.FIXED_FILTER`` (``fixed``), or from a mixture
# fitted to uniform random numbers (``code_random``, the released code's).
FILTER_INITS = ("local_bootstrap", "fixed", "code_random")
WARMUP_LOSSES = ("mixup", "ce")
# The loss the filter sees: cross-entropy of the logits (the paper), or of the softmax outputs
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


_SHARE = Interval(float, 0.0, 1.0)
_WEIGHT = Interval(float, 0.0)


@dataclass(frozen=True)
class FedDivClientSettings(Checked):
    """FedDiv's client-side settings, the same every round: flat options of
    ``conf/strategy/feddiv.yaml``, sent with every train instruction."""

    zeta: float = option(_SHARE, "relabel a noisy sample whose global max-probability is >= zeta")
    xi: float = option(_WEIGHT, "the de-biasing strength of the predictive-consistency sampler")
    momentum: float = option(_SHARE, "m of the local class prior's moving average")
    mixup_alpha: float = option(_WEIGHT, "mixup's Beta(alpha, alpha)")
    clean_client: float = option(_SHARE, "a client whose estimated noise level is below this trains on all labels")
    em_iters: int | None = option(Interval(int, 1, or_none=True),
                                  "EM iterations of the local filter (null: to convergence, at most 100)")
    prior_confidence: float | None = option(Interval(float, 0.0, 1.0, or_none=True),
                                            "null: the prior averages every sample (eq. 12); a number: only "
                                            "samples whose de-biased max-probability exceeds it")
    relabel: bool = option(Flag(), "Table 5's ablation: false relabels nothing")
    pcs: bool = option(Flag(), "Table 5's ablation: false drops the consistency sampler")
    warmup_loss: str = option(Options(WARMUP_LOSSES), "mixup (main text) | ce (the supplement)")
    filter_init: str = option(Options(FILTER_INITS), "the split before any global filter exists")
    filter_loss: str = option(Options(FILTER_LOSSES), "the filter's loss: ce | softmax_ce")
    filter_transform: str = option(Options(FILTER_TRANSFORMS), "the images the filter's losses are scored on")
    filter_scope: str = option(Options(FILTER_SCOPES), "which filter splits a client's samples (Table 5)")
    pcs_mode: str = option(Options(PCS_MODES), "when the consistency sampler re-selects: epoch | cached")
    pcs_code_rules: bool = option(Flag(), "the released code's selection rules (clean samples only early on "
                                          "and up to delta_hat 0.2)")
    bn_extra_pass: bool = option(Flag(), "the released code's unused forward of each un-mixed batch")
    balanced_split: bool = option(Flag(), "beyond the paper and the code: every given label keeps the client's "
                                          "clean share, its samples of smallest filter loss")


@dataclass(frozen=True)
class FedDivIns(Checked):
    """What a FedDiv client does this round (its train instruction under ``feddiv``)."""

    phase: str = option(Options(PHASES), "warmup: train on everything, no filter | main")
    params: FedDivClientSettings = option(meaning="the run's client-side settings")
    eta: float = option(_WEIGHT, "the weight of the uniform-prior regulariser (1 non-IID, 0 IID)")
    filter: NoiseFilter | None = option(meaning="the global noise filter (None: none yet)", default=None,
                                        namespaced=True)
    seed: int = option(Interval(int, 0), "the run's seed (the client derives its mixture seeds from it)", default=0)
    diagnostics: bool = option(meaning="return ground-truth counts where the node knows its true labels",
                               default=False)


@dataclass(frozen=True)
class Diagnostics:
    """Ground-truth counts of one main-phase round (only from a node that allows them).

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
class FedDivRes:
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
