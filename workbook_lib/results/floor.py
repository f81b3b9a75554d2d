"""The fewest multiply-adds (and bytes) an exact sample needs, part by part (counted by
:mod:`workbook_lib.nodemask.floor`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record

@dataclass
class FloorPart(Record):
    """One part of the floor, forward + backward, for the whole batch."""

    sparse_macs: float
    dense_macs: float
    bytes: float


@dataclass
class WorkFloor(Record):
    """The fewest multiply-adds and bytes of one batch (see the module docstring)."""

    batch_size: int
    layers: int
    hidden: int
    parts: dict[str, FloorPart] = field(default_factory=dict)

    @property
    def sparse_macs(self) -> float:
        return sum(p.sparse_macs for p in self.parts.values())

    @property
    def dense_macs(self) -> float:
        return sum(p.dense_macs for p in self.parts.values())

    @property
    def bytes(self) -> float:
        return sum(p.bytes for p in self.parts.values())

    def per_sample(self, what: str) -> float:
        """``sparse_macs``, ``dense_macs`` or ``bytes`` divided by the batch size."""
        if what not in ("sparse_macs", "dense_macs", "bytes"):
            raise ValueError(f"'what' must be sparse_macs, dense_macs or bytes (got {what!r})")
        return getattr(self, what) / self.batch_size

    def seconds_at(self, sparse_gmacs: float, dense_gmacs: float) -> float:
        """Seconds per sample the floor's products take at these rates (G multiply-adds/s)."""
        if sparse_gmacs <= 0 or dense_gmacs <= 0:
            raise ValueError(f"rates must be positive (got {sparse_gmacs}, {dense_gmacs})")
        return (self.per_sample("sparse_macs") / (sparse_gmacs * 1e9)
                + self.per_sample("dense_macs") / (dense_gmacs * 1e9))
