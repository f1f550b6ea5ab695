"""Dynamic participation: which clients take part from which round."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.decimals import as_written
from common.seeding import rng_for


@dataclass(frozen=True)
class Participation:
    """When each client may take part: the late joiners (partition ids) from round ``join_round`` on,
    every other client from round 1. The default has no late joiner."""

    late: frozenset[int] = frozenset()
    join_round: int = 1

    @classmethod
    def drawn(cls, num_clients: int, share: float, join_round: int, seed: int) -> Participation:
        """round(share * N) late joiners of partition ids 0..N-1, drawn uniformly from the seed's own stream."""
        count = round(as_written(share) * num_clients)
        late = rng_for(seed, "late-joiners").choice(num_clients, size=count, replace=False)
        return cls(frozenset(int(pid) for pid in late), join_round if count else 1)

    def present(self, clients: Sequence[int], server_round: int) -> list[int]:
        """Those of ``clients`` that take part in round ``server_round``."""
        if server_round >= self.join_round:
            return list(clients)
        return [pid for pid in clients if pid not in self.late]

    def share(self, num_clients: int) -> float:
        """The late joiners' share of a federation of ``num_clients``."""
        return len(self.late) / num_clients

    def joins_by(self, server_round: int) -> bool:
        """Whether every client takes part in round ``server_round``."""
        return server_round >= self.join_round
