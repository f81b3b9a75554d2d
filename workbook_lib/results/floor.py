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


class _Totals:
    """The sums of a floor's ``parts`` (``FloorPart``s of one batch of ``batch_size``)."""

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


@dataclass
class WorkFloor(_Totals, Record):
    """The fewest multiply-adds and bytes of one batch (see the module docstring)."""

    batch_size: int
    layers: int
    hidden: int
    parts: dict[str, FloorPart] = field(default_factory=dict)


@dataclass
class ConvertFloor(_Totals, Record):
    """The fewest multiply-adds and bytes of one batch of a converted encoder
    (:meth:`workbook_lib.nodemask.convert.ConvertedEncoder.floor`): one part per layer and edge
    type (and per-node module), forward + backward, for the whole batch, plus the wildtype
    once per batch; ``all_changed_from`` names the first layer at which every gene of every
    sample has changed (None if none), ``all_changed_macs`` what the layers from there on cost
    per sample."""

    batch_size: int
    num_nodes: int
    parts: dict[str, FloorPart] = field(default_factory=dict)
    all_changed_from: str | None = None
    all_changed_macs: float = 0.0

    def __str__(self) -> str:
        """``print(fast.floor(deleted))``: the batch, then :meth:`table`."""
        return (f"floor of a batch of {self.batch_size} sample{'s' if self.batch_size != 1 else ''}"
                f" on {self.num_nodes} genes: multiply-adds per exact sample, forward and "
                f"backward\n{self.table()}")

    def table(self) -> str:
        """One line per part: multiply-adds per sample (sparse, dense), then the total. A part
        counted once per batch (the wildtype) is shown over the batch's samples, as it is
        shared."""
        wide = max([48] + [len(k) + 1 for k in self.parts])
        rows = [f"  {'part':<{wide}} {'sparse/sample':>14} {'dense/sample':>14}"]
        rows += [f"  {k:<{wide}} {p.sparse_macs / self.batch_size:>14.4g} "
                 f"{p.dense_macs / self.batch_size:>14.4g}" for k, p in self.parts.items()]
        rows.append(f"  {'total':<{wide}} {self.per_sample('sparse_macs'):>14.4g} "
                    f"{self.per_sample('dense_macs'):>14.4g}")
        once = [p for k, p in self.parts.items() if "once per batch" in k]
        if once:  # (a user trial: a row 97% of the total, explained in five words)
            total = self.per_sample("sparse_macs") + self.per_sample("dense_macs")
            wt = sum(p.sparse_macs + p.dense_macs for p in once) / self.batch_size
            share = f", {wt / total:.0%} of the total here" if total > 0 else ""
            rows.append(f"  (the wildtype runs once per batch: its row is its count over the "
                        f"batch's {self.batch_size} sample{'s' if self.batch_size != 1 else ''}"
                        f"{share}; per sample it shrinks as 1/B with the batch size B, the other "
                        "rows do not)")
        if self.all_changed_from:
            rows.append(f"  every gene changes from {self.all_changed_from}: "
                        f"{self.all_changed_macs:.4g} multiply-adds per sample from there on")
        return "\n".join(rows)
