"""Notebook 02's result: exactness re-checked, the cost model, message forms, mask generation,
one layer across B, the strategy benchmark and peak memory."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measurement.timing import Stat
from ..records import Record
from ..common.progress import note
from . import costmodel
from .bench import BenchResult
from .claim_probes import DualForwardMasks
from .benchmarks import LayerSweep, MaskGeneration
from .memory_study import MemoryStudy


@dataclass
class CostModelStudy(Record):
    """The sweep, the fitted model and the crossover checked against direct timings."""

    points: list[costmodel.SweepPoint]
    model: costmodel.CostModel
    crossover: list[costmodel.CrossoverCheck]
    run_hidden: int
    crossover_at_run_hidden: float | None
    seconds: float = 0.0

    def forms(self) -> list[tuple[int, int, Stat, Stat]]:
        """(E, H, gather-scatter, CSR product) of the unmasked layers."""
        gs = {(p.E, p.H): p.stat for p in self.points if p.kind == "unmasked"}
        sp = {(p.E, p.H): p.stat for p in self.points if p.kind == "spmm"}
        return [(e, h, gs[(e, h)], sp[(e, h)]) for (e, h) in sorted(gs) if (e, h) in sp]


def cost_model_study(params: dict, num_nodes: int, device: torch.device) -> CostModelStudy:
    import time

    t0 = time.perf_counter()
    note("02: cost-model sweep (every primitive interleaved)")
    cfg = costmodel.SweepConfig(num_nodes=num_nodes, edges=params["sweep_edges"],
                                hidden=params["sweep_hidden"], p=params["sweep_p"],
                                device=device, warmup=params["warmup"],
                                min_rounds=params["min_repeats"],
                                target=params["precision_target"],
                                max_time_s=10 * params["time_budget_s"],
                                seed=params["seed"])
    pts = costmodel.sweep(cfg)
    model = costmodel.fit(pts)
    return CostModelStudy(points=pts, model=model, crossover=costmodel.crossover_checks(model, pts),
                          run_hidden=params["hidden"],
                          crossover_at_run_hidden=model.crossover_p(params["hidden"]),
                          seconds=time.perf_counter() - t0)


@dataclass
class MaskCostResult(Record):
    """Notebook 02's results."""

    device: str
    exact: dict[str, float]
    exact_graph: str
    cost: CostModelStudy
    mask_generation: MaskGeneration
    layers: LayerSweep
    bench: BenchResult
    memory: MemoryStudy
    notes: list[str] = field(default_factory=list)
    dual_masks: DualForwardMasks | None = None  # what the dual forward adds (a claim's figure)
