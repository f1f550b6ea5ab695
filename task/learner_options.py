"""The options of the local learners (``task/learners/``) and what the server schedules for them.

Torch-free, like ``task.local_training``: strategies and the protocol carry them without importing
the training loop. ``conf/strategy/local/learner/<name>.yaml`` holds the run defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.validation import Choice, Integer, Nullable, Real, check_fields, rule

LEARNERS = ("ce", "mixup", "sce", "coteaching", "lsr")
"""ce: cross-entropy; mixup: Zhang et al. 2018; sce: Wang et al. 2019; coteaching: Han et al. 2018;
lsr: FedLSR's local self-regularisation (Jiang et al. 2022)."""

LSR_DISTILLS = ("js", "l1", "none")
LSR_CLS_LOSSES = ("nll", "logits_ce")
LSR_REDUCTIONS = ("sum", "elementwise_mean")
LSR_ENTROPY_FORMS = ("outputs", "tempered")
AUGMENT_DRAWS = ("sample", "batch")


@dataclass(frozen=True)
class LsrOptions:
    """FedLSR (Jiang et al., CIKM 2022, Sec. 3.3 and Algorithm 1). The text's reading is each default;
    the released code's choice is the named alternative (docs/learners.md lists them).

    gamma: the weight of the self-distillation term once warmed up (Table 2 per noise level).
    warmup_rounds: t_w, the rounds over which the weight rises linearly from 0 to gamma (10 / 20 /
        40 / 10 for MNIST / Fashion-MNIST / CIFAR-10 / Clothing1M).
    sharpen_temperature: T of eq. (7) (1/2, from MixMatch).
    distill_temperature: T_d of eq. (8) (1/3).
    distill: ``js`` (eq. 9, IID) | ``l1`` (the paper's non-IID choice) | ``none`` (Table 5's "w/o").
    cls_loss: ``nll``: -log p_s[y], cross-entropy of the sharpened prediction (Sec. 3.3) |
        ``logits_ce``: cross-entropy applied to p_s as if it were logits (released code).
    reduction: ``sum``: each divergence summed over classes, averaged over the batch (the definition
        of KL and of the L1 distance) | ``elementwise_mean``: averaged over batch x classes (released code).
    entropy_weight: lambda_e of LSR+ (eq. 11); 0 is plain LSR, the paper's tables.
    entropy_form: ``outputs``: the mean entropy of softmax(o1) and softmax(o2) (the text: "entropy
        regularization on o1 and o2") | ``tempered``: the entropy of softmax(q1) (released code).
    augment_draw: ``sample``: each image gets its own random view | ``batch``: one draw for the
        whole batch (released code). The paper does not say.
    """

    gamma: float = field(default=0.4, metadata=rule(Real(low=0)))
    warmup_rounds: int = field(default=20, metadata=rule(Integer(low=0)))
    sharpen_temperature: float = field(default=0.5, metadata=rule(Real(low=0, low_open=True)))
    distill_temperature: float = field(default=1 / 3, metadata=rule(Real(low=0, low_open=True)))
    distill: str = field(default="js", metadata=rule(Choice(LSR_DISTILLS)))
    cls_loss: str = field(default="nll", metadata=rule(Choice(LSR_CLS_LOSSES)))
    reduction: str = field(default="sum", metadata=rule(Choice(LSR_REDUCTIONS)))
    entropy_weight: float = field(default=0.0, metadata=rule(Real(low=0)))
    entropy_form: str = field(default="outputs", metadata=rule(Choice(LSR_ENTROPY_FORMS)))
    augment_draw: str = field(default="sample", metadata=rule(Choice(AUGMENT_DRAWS)))

    def __post_init__(self) -> None:
        check_fields(self)

    def weight_at(self, stage_round: int) -> float:
        """gamma_t: gamma * t / t_w during the warm-up (t counted from 0), then gamma (Sec. 3.3)."""
        if stage_round >= self.warmup_rounds:
            return self.gamma
        return self.gamma * stage_round / self.warmup_rounds


@dataclass(frozen=True)
class SceOptions:
    """Symmetric cross-entropy (Wang et al., ICCV 2019): alpha CE + beta RCE, with
    RCE = -sum_c p_c log q_c against the one-hot label q.

    alpha, beta: the weights (0.1 and 1, FedLSR Sec. 4.1 for Fashion-MNIST, CIFAR-10 and Clothing1M).
    label_floor: the one-hot label is clamped to [label_floor, 1] so log 0 is finite
        (RCE = -log(label_floor) * (1 - p_y)).
    """

    alpha: float = field(default=0.1, metadata=rule(Real(low=0)))
    beta: float = field(default=1.0, metadata=rule(Real(low=0)))
    label_floor: float = field(default=1e-4, metadata=rule(Real(low=0, low_open=True, below=1)))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class CoteachingOptions:
    """Co-teaching (Han et al., NeurIPS 2018): two networks, each trained on the samples its peer finds
    small-loss. The share kept per batch is R(T) = 1 - min(T / T_k, 1) * forget_rate.

    forget_rate: eps, the share finally dropped. Co-teaching assumes the noise rate is known and sets
        eps to it; there is no default, a run with ``learner=coteaching`` must set it.
    ramp_rounds: T_k, the rounds (counted from 0) over which the dropped share rises to eps (the
        Co-teaching paper ramps over 10 epochs; a federated round plays the epoch's part here).
    """

    forget_rate: float | None = field(default=None, metadata=rule(Nullable(Real(low=0, below=1))))
    ramp_rounds: int = field(default=10, metadata=rule(Integer(low=0)))

    def __post_init__(self) -> None:
        check_fields(self)

    def forget_at(self, stage_round: int) -> float:
        """The share of each batch dropped in round ``stage_round``: min(T / T_k, 1) * eps."""
        eps = self.forget_rate or 0.0
        if stage_round >= self.ramp_rounds:
            return eps
        return eps * stage_round / self.ramp_rounds


@dataclass(frozen=True)
class LearnerSchedule:
    """What the server sets for a learner each round: LSR's current distillation weight gamma_t and
    Co-teaching's current forget rate (FedLSR: gamma is "received from the server in each round")."""

    distill_weight: float = field(default=0.0, metadata=rule(Real(low=0)))
    forget_rate: float = field(default=0.0, metadata=rule(Real(low=0, below=1)))

    def __post_init__(self) -> None:
        check_fields(self)
