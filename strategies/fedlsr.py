"""FedLSR (Jiang et al., CIKM 2022): FedAvg whose clients train with local self-regularisation.

No client module and no options of its own: the ``lsr`` learner (``task/learners/lsr.py``) is the
client's work and its options are the ``train.lsr`` block; the server sends gamma_t every round
(``FedAvg.train_instruction``) and averages the models weighted by local set size (Sec. 3.3).
"""

from __future__ import annotations

from strategies.fedavg import FedAvg, NoOptions
from strategies.registry import RoundMethod, round_entry

STRATEGY = round_entry("fedlsr", RoundMethod(NoOptions, FedAvg, learner="lsr"))
