"""How a method shapes the local training loop, in the spirit of Lightning's callbacks.

``train_local`` runs plain local SGD and calls one ``TrainingHooks`` object at fixed points: once at
the start, for the learner (the objective on a batch), for the rows of each epoch, for extra loss
terms, after each backward pass and after each optimiser step. The base class is plain training with
the settings' own learner and, when ``prox_weight > 0``, the proximal pull toward the starting
(global) weights; a method subclasses it and overrides what it changes (its objective, its sampler,
its gradient rule, its own loss term). The loop itself names no method.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from task.learner_settings import LearnerSchedule
from task.learners import Learner, make_learner
from task.local_training import LocalTraining


def beside_parameters(tensors: Sequence[torch.Tensor], model: nn.Module, what: str) -> list[torch.Tensor]:
    """Private copies of ``tensors`` (one per parameter of ``model``, in order) on each parameter's
    device and dtype, refused when their shapes differ from the parameters'. Copies, so they can never
    alias (and move with) the parameters being trained."""
    params = list(model.parameters())
    if [tuple(t.shape) for t in tensors] != [tuple(p.shape) for p in params]:
        raise RuntimeError(f"{what} does not match the model's parameters")
    return [t.detach().to(device=p.device, dtype=p.dtype, copy=True) for t, p in zip(tensors, params)]


def proximal(params: Sequence[nn.Parameter], anchor: Sequence[torch.Tensor], squared: bool) -> torch.Tensor:
    """||w - anchor|| over all parameters, squared or not."""
    # vector_norm's gradient at 0 is 0 (a subgradient), so the first step, where w == anchor, stays
    # finite; a sqrt of a sum of squares would give NaN there.
    per_tensor = torch.stack([torch.linalg.vector_norm(p - g) for p, g in zip(params, anchor)])
    distance = torch.linalg.vector_norm(per_tensor)
    return distance.square() if squared else distance


class TrainingHooks:
    """Plain local training: ``training``'s learner with this round's ``schedule``, and its proximal
    term. Subclasses override the hooks they change and call ``super()`` where they add to it.

    training: the run's local training settings (the loop reads epochs, batch size and optimiser here).
    schedule: the learner's values for this round from the server (default: none scheduled).
    """

    def __init__(self, training: LocalTraining, schedule: LearnerSchedule | None = None) -> None:
        self.training = training
        self.schedule = schedule if schedule is not None else LearnerSchedule()
        self._anchor: list[torch.Tensor] | None = None

    def on_train_start(self, model: nn.Module) -> None:
        """Called once, with the model on its device, before the first step: the proximal term keeps
        the starting weights (the global model's) here."""
        if self.training.prox_weight > 0:
            self._anchor = [param.detach().clone() for param in model.parameters()]

    def learner(self, model: nn.Module, generator: torch.Generator) -> Learner:
        """The objective on one batch (its own random draws from ``generator``)."""
        return make_learner(self.training, self.schedule, generator)

    def epoch_rows(self, epoch: int, model: nn.Module) -> torch.Tensor | None:
        """The local rows epoch ``epoch`` trains on, chosen with the current model (None: every row);
        the epoch shuffles them."""
        return None

    def extra_losses(self, params: Sequence[nn.Parameter]) -> Iterator[torch.Tensor]:
        """Terms added, in order, to a batch's objective: the proximal term when ``prox_weight > 0``."""
        if self._anchor is not None:
            squared = self.training.prox_norm == "squared"
            yield self.training.prox_weight * proximal(params, self._anchor, squared)

    def after_backward(self, model: nn.Module) -> None:
        """Called after every backward pass, before the optimiser's step (gradients may change here)."""

    def after_step(self, model: nn.Module) -> None:
        """Called right after every optimiser step."""
