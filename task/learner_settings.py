"""The settings of the local learners (``task/learners/``) and what the server schedules for them.

Torch-free, like ``task.local_training``: strategies and the protocol carry them without importing
the training loop. ``conf/strategy/local/learner/<name>.yaml`` holds the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.validation import Checked, Interval, Options, option

LEARNERS = ("ce", "mixup", "sce", "coteaching", "lsr")
"""ce: cross-entropy; mixup: Zhang et al. 2018; sce: Wang et al. 2019; coteaching: Han et al. 2018;
lsr: FedLSR's local self-regularisation (Jiang et al. 2022)."""

LSR_DISTILLS = ("js", "l1", "none")
LSR_CLS_LOSSES = ("logits_ce", "nll")
LSR_REDUCTIONS = ("elementwise_mean", "sum")
LSR_ENTROPY_FORMS = ("outputs", "tempered")
AUGMENT_DRAWS = ("sample", "batch")

_WEIGHT = Interval(float, 0, finite=True)
_TEMPERATURE = Interval(float, 0, closed="neither", finite=True)
_SHARE = Interval(float, 0, 1, closed="left", finite=True)


@dataclass(frozen=True)
class LsrSettings(Checked):
    """FedLSR's local self-regularisation (Jiang et al., CIKM 2022, Sec. 3.3 and Algorithm 1). Each
    default is the text's reading where the text decides, else the released code's (docs/learners.md)."""

    gamma: float = option(_WEIGHT, "the self-distillation weight once warmed up (Table 2, per noise level)")
    warmup_rounds: int = option(Interval(int, 0), "t_w: rounds over which the weight rises linearly from 0 to gamma")
    sharpen_temperature: float = option(_TEMPERATURE, "T of eq. (7), the sharpening of the prediction")
    distill_temperature: float = option(_TEMPERATURE, "T_d of eq. (8), the distillation's temperature")
    distill: str = option(Options(LSR_DISTILLS), "js (eq. 9, IID) | l1 (the non-IID choice) | none (Table 5)")
    cls_loss: str = option(Options(LSR_CLS_LOSSES),
                           "logits_ce: CE with p_s in the logits' place of eq. (1) (text and code) | nll: -log p_s[y]")
    reduction: str = option(Options(LSR_REDUCTIONS),
                            "elementwise_mean: the divergence averaged over batch x classes, the code's, which "
                            "Table 2's gammas weigh | sum: over classes, mean over the batch (M times as much)")
    entropy_weight: float = option(_WEIGHT, "lambda_e of LSR+ (eq. 11); 0 is plain LSR")
    entropy_form: str = option(Options(LSR_ENTROPY_FORMS),
                               "outputs: entropy of softmax(o1), softmax(o2) | tempered: of softmax(q1)")
    augment_draw: str = option(Options(AUGMENT_DRAWS), "sample: one random view per image | batch: one per batch")

    def weight_at(self, stage_round: int) -> float:
        """gamma_t: gamma * t / t_w during the warm-up (t counted from 0), then gamma (Sec. 3.3)."""
        if stage_round >= self.warmup_rounds:
            return self.gamma
        return self.gamma * stage_round / self.warmup_rounds


@dataclass(frozen=True)
class SceSettings(Checked):
    """Symmetric cross-entropy (Wang et al., ICCV 2019): alpha CE + beta RCE, with
    RCE = -sum_c p_c log q_c against the one-hot label q clamped to [label_floor, 1]."""

    alpha: float = option(_WEIGHT, "the weight of the cross-entropy")
    beta: float = option(_WEIGHT, "the weight of the reverse cross-entropy")
    label_floor: float = option(Interval(float, 0, 1, closed="neither", finite=True),
                                "the one-hot label's floor, so RCE's log 0 is log(label_floor)")


@dataclass(frozen=True)
class CoteachingSettings(Checked):
    """Co-teaching (Han et al., NeurIPS 2018): two networks, each trained on the samples its peer finds
    small-loss. The share kept per batch is R(T) = 1 - min(T / T_k, 1) * forget_rate."""

    forget_rate: float | None = option(Interval(float, 0, 1, closed="left", finite=True, or_none=True),
                                       "eps, the share finally dropped; Co-teaching needs it set (the noise rate)")
    ramp_rounds: int = option(Interval(int, 0), "T_k: rounds (from 0) over which the dropped share rises to eps")

    def forget_at(self, stage_round: int) -> float:
        """The share of each batch dropped in round ``stage_round``: min(T / T_k, 1) * eps."""
        eps = self.forget_rate or 0.0
        if stage_round >= self.ramp_rounds:
            return eps
        return eps * stage_round / self.ramp_rounds


@dataclass(frozen=True)
class LearnerSchedule(Checked):
    """What the server sets for a learner each round: LSR's current distillation weight gamma_t and
    Co-teaching's current forget rate (FedLSR: gamma is "received from the server in each round")."""

    distill_weight: float = option(_WEIGHT, "LSR's gamma_t", default=0.0)
    forget_rate: float = option(_SHARE, "Co-teaching's dropped share this round", default=0.0)
