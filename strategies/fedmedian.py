"""FedMedian (Yin et al. 2018): FedAvg with the coordinate-wise median in place of the mean."""

from __future__ import annotations

from flwr.app import ArrayRecord

from strategies.aggregation import as_record, coordinate_median
from strategies.base import TrainReply
from strategies.fedavg import FedAvg, client_states


class FedMedian(FedAvg):
    """Each coordinate of the new global model is the median of the clients' values (unweighted)."""

    name = "fedmedian"

    def aggregate(self, replies: dict[int, TrainReply]) -> ArrayRecord:
        """The coordinate-wise median of the clients' arrays."""
        return as_record(coordinate_median(client_states(replies)))
