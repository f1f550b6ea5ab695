"""The server's map of the federation: which Flower node holds which partition."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Federation:
    """node_of: partition id -> Flower node id (node ids are random; partitions are ours).
    num_examples: partition id -> size of that client's local training set.
    without_state: the partitions whose nodes keep their state in memory only (no state folder).
    """

    node_of: dict[int, int]
    num_examples: dict[int, int]
    without_state: frozenset[int] = frozenset()
    _partition_of: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_partition_of", {node: pid for pid, node in self.node_of.items()})

    @property
    def partition_ids(self) -> list[int]:
        """Every partition id in the federation, ascending."""
        return sorted(self.node_of)

    def partition_of(self, node_id: int) -> int:
        """The partition id held by Flower node ``node_id``."""
        return self._partition_of[node_id]
