"""Names shared by every layer, with no heavy imports: the strategies and the notebooks.

``NOTEBOOKS`` is the one list of notebooks, in execution order, with what each one reads from
the run folder (so the runner, the SLURM scripts, ``--resume`` and the verdict agree).
"""
from __future__ import annotations

from dataclasses import dataclass

STRATEGY_NAMES = (
    "subgraph_cpu",
    "replicated_mask_cpu",
    "replicated_mask_stored",
    "device_mask_loop",
    "device_mask_vectorized",
    "replicated_filter_device",
    "node_mask_shared",
    "dango_wildtype",
)


@dataclass(frozen=True)
class NotebookInfo:
    """One notebook of the workbook."""

    name: str  # file stem, e.g. "03_data_vs_model_timing"
    title: str
    requires: tuple[str, ...] = ()  # notebooks whose complete results it needs
    reads: tuple[str, ...] = ()  # notebooks whose results it uses when present
    distributed: bool = False  # launches torchrun (needs the allocation's nodes and GPUs)
    needs_gap: bool = False  # compares two pipelines (gap_strategies: slow, fast)

    @property
    def number(self) -> str:
        return self.name[:2]


NOTEBOOKS: tuple[NotebookInfo, ...] = (
    NotebookInfo("01_graph_inventory", "Graph size inventory"),
    NotebookInfo("02_mask_cost_model", "Mask cost model and strategy comparison",
                 reads=("01_graph_inventory",)),
    NotebookInfo("03_data_vs_model_timing", "Data-only vs model timing"),
    NotebookInfo("04_ddp_scaling", "DDP scaling", reads=("03_data_vs_model_timing",),
                 distributed=True, needs_gap=True),
    NotebookInfo("05_verdict", "Verdict", requires=("03_data_vs_model_timing",),
                 reads=("01_graph_inventory", "02_mask_cost_model", "04_ddp_scaling"),
                 needs_gap=True),
    NotebookInfo("06_adopt_fix", "Adopting the fix",
                 reads=("02_mask_cost_model", "04_ddp_scaling"), needs_gap=True),
)

NOTEBOOK_NAMES = tuple(nb.name for nb in NOTEBOOKS)
BY_NAME = {nb.name: nb for nb in NOTEBOOKS}


def notebook_info(name: str) -> NotebookInfo:
    """The catalog entry of a notebook by its full name."""
    if name not in BY_NAME:
        raise KeyError(name)
    return BY_NAME[name]


def inputs_of(name: str) -> tuple[str, ...]:
    """Every notebook whose results ``name`` reads (required or optional); none for a notebook
    outside the catalog."""
    nb = BY_NAME.get(name)
    return () if nb is None else nb.requires + nb.reads


def requires_of(name: str) -> tuple[str, ...]:
    nb = BY_NAME.get(name)
    return () if nb is None else nb.requires


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of the built-in strategies (not a user pipeline)."""
    return name in STRATEGY_NAMES
