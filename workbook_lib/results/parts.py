"""Where a converted step's time goes, part by part (timed by
:func:`workbook_lib.nodemask.parts.time_parts`), and each part beside its floor."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record
from .floor import ConvertFloor


@dataclass
class PartTime(Record):
    """One part's wall time per step: its forward and the backward of its autograd functions."""

    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass
class PartRow(Record):
    """One line of :meth:`StepParts.against`: a part's time per step beside its floor's."""

    label: str
    measured_s: float
    forward_s: float
    backward_s: float
    floor_s: float | None  # None: the part counts no multiply-adds (the plan, the rest)
    floor_parts: list[str] = field(default_factory=list)  # the floor's parts it covers

    @property
    def ratio(self) -> float | None:
        return self.measured_s / self.floor_s if self.floor_s else None


@dataclass
class StepParts(Record):
    """A step's wall time per part (seconds per step, over ``steps`` steps): each part's own
    time, less the parts timed inside it. ``step_s`` is the step's time in the same calls;
    what no part holds (the backward of PyTorch's own operators, the loss) is :attr:`rest_s`.
    ``synchronized``: the device was synchronized around each part (a GPU), which slows the
    step."""

    step_s: float
    steps: int
    parts: dict[str, PartTime] = field(default_factory=dict)
    synchronized: bool = False
    # module paths whose floor a label also holds (a pooled tail's modules: the readout's)
    covers: dict[str, list[str]] = field(default_factory=dict)

    @property
    def rest_s(self) -> float:
        return self.step_s - sum(p.total_s for p in self.parts.values())

    def against(self, floor: ConvertFloor, sparse_gmacs: float, dense_gmacs: float,
                min_share: float = 0.005) -> list[PartRow]:
        """Each part beside its floor's time per step at these rates (G multiply-adds/s): a
        floor part (named by module, ``path[relation]``) is booked to the most specific label it
        falls under (:func:`covers`: its own name, else the longest), or to the part that holds
        its module (:attr:`covers`: a pooled tail's, the readout). Parts in order of measured time; those under ``min_share`` of the step
        with no floor in one row ("other parts"); a floor part under no label in a row of its
        own with no measured time; then the rest.

        Raises:
            ValueError: a rate that is not positive.
        """
        if sparse_gmacs <= 0 or dense_gmacs <= 0:
            raise ValueError(f"rates must be positive (got {sparse_gmacs}, {dense_gmacs})")
        booked: dict[str, list[str]] = {lb: [] for lb in self.parts}
        unbooked = []
        for name in floor.parts:
            held = [lb for lb, paths in self.covers.items()
                    if lb in self.parts and any(covers(p, name) for p in paths)]
            under = held or [lb for lb in self.parts if covers(lb, name)]
            if under:
                booked[max(under, key=lambda lb: (lb == name, len(lb.rstrip("*"))))].append(name)
            else:
                unbooked.append(name)

        def secs(names: list[str]) -> float | None:
            if not names:
                return None
            ps = [floor.parts[n] for n in names]
            return (sum(p.sparse_macs for p in ps) / (sparse_gmacs * 1e9)
                    + sum(p.dense_macs for p in ps) / (dense_gmacs * 1e9))
        rows, small = [], []
        for lb, p in sorted(self.parts.items(), key=lambda kv: -kv[1].total_s):
            if booked[lb] or p.total_s >= min_share * self.step_s:
                rows.append(PartRow(lb, p.total_s, p.forward_s, p.backward_s, secs(booked[lb]),
                                    booked[lb]))
            elif p.total_s > 0:
                small.append(p)
        if small:
            rows.append(PartRow(f"other parts ({len(small)}, each under {min_share:.1%} of the "
                                "step)", sum(p.total_s for p in small),
                                sum(p.forward_s for p in small),
                                sum(p.backward_s for p in small), None))
        rows += [PartRow(n, 0.0, 0.0, 0.0, secs([n]), [n]) for n in unbooked]
        rows.append(PartRow("rest (PyTorch's own operators' backward, the loss, the step's "
                            "glue)", self.rest_s, 0.0, 0.0, None))
        return rows


def covers(label: str, name: str) -> bool:
    """Whether the floor part ``name`` falls under the timed part ``label``: the label itself,
    ``label[...]`` (an edge type of it), ``label.…`` (a module inside it), or ``prefix…`` for a
    fused sum's ``prefix*``; a second call's ``name'`` as ``name``."""
    name = name.rstrip("'")  # a module's second call (the floor's ``path'``): the same part
    if label.endswith("*"):
        return name.startswith(label[:-1])
    return name == label or name.startswith(label + "[") or name.startswith(label + ".")
