"""Notebook 01's results (``01_graph_inventory.json``): the bytes of every representation of a
batch, per edge type and at the real size; computed by :mod:`workbook_lib.studies.inventory`."""
from __future__ import annotations

from dataclasses import dataclass, field

from .stat import Stat
from ..records import Record


@dataclass
class FootprintRow(Record):
    """What a perturbation changes at one layer, for one edge type (or ``"all"``): the fraction
    of genes whose aggregation (``"all"``: whose layer output) differs from the wildtype's, and
    the fraction of edges whose message differs (their source changed at the layer before),
    per sample."""

    layer: int
    edge_type: str
    genes: Stat
    edges: Stat


@dataclass
class EdgeTypeRow(Record):
    name: str
    nodes: int
    edges: int
    bytes_int64: int
    bytes_int32: int


@dataclass
class RealSize(Record):
    """Arithmetic at the real graph's edge count (the spec's), whatever this run's scale."""

    total_edges: int
    mask_bytes_per_sample: float
    mask_bytes_per_batch_28: float
    dataset_mask_bytes: float
    incidence_cache_bytes_int64: float
    incidence_cache_bytes_int32: float
    num_samples: int


@dataclass
class InventoryResult(Record):
    """Notebook 01's results: sizes computed from the snapshot and sampled perturbations."""

    graph_name: str
    source: str
    scale: float
    num_genes: int
    total_edges: int
    edge_types: list[EdgeTypeRow]
    perturbation_k: object
    num_perturbations: int
    removed_edge_fraction: Stat  # per sample, fraction of all edges
    hop_coverage: dict[int, Stat]  # hops -> fraction of genes within reach, per sample
    bytes_per_sample: dict[str, float]
    bytes_per_batch: dict[str, dict[int, float]]
    dataset_bytes: dict[str, float]
    incidence_cache_bytes: int
    measured_batch_mask_bytes_per_sample: float = 0.0  # in a collated strategy-2 batch
    measured_incidence_cache_bytes: int = 0  # strategy 2's prepared host structure
    real_size: RealSize | None = None
    ignored_types: list[str] = field(default_factory=list)
    footprint: list[FootprintRow] = field(default_factory=list)  # per layer and edge type
    builtin: bool = True  # built-in strategies ran: the investigation's batch sizes apply


REPRESENTATION_LABELS = {
    "perturbation_indices": "perturbation indices (int64)",
    "removed_edge_indices": "indices of removed edges (int64)",
    "edge_masks": "boolean edge masks (1 B/edge, all types)",
    "replicated_edge_index": "replicated edge_index (int64, 1 copy/sample)",
}
