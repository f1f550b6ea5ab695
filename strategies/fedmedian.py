"""FedMedian (Yin et al. 2018): FedAvg with the coordinate-wise median in place of the mean."""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict

from strategies.fedavg import FedAvg, client_states, to_record
from strategies.utils import coordinate_median


class FedMedian(FedAvg):
    """Each coordinate of the new global model is the median of the clients' values (unweighted).

    Arguments: see ``FedAvg``.
    """

    def aggregate(self, replies: dict[int, RecordDict]) -> ArrayRecord:
        return to_record(coordinate_median(client_states(replies)))
