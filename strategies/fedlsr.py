"""FedLSR (Jiang et al., CIKM 2022): FedAvg whose clients train with local self-regularisation.

No client plug-in and no settings of its own: the ``lsr`` learner (``task/learners/lsr.py``) is the
client's work and its settings are the ``train.lsr`` block; the server sends gamma_t every round
(``FedAvg.train_instruction``) and averages the models weighted by local set size (Sec. 3.3).
"""

from __future__ import annotations

from strategies.fedavg import FedAvg


class FedLSR(FedAvg):
    """FedAvg whose clients always train with the ``lsr`` learner."""

    name = "fedlsr"
    learner = "lsr"
