"""What every notebook does first: validate its parameters, configure the run, load the graph."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..running import environment
from ..report import plotting
from ..running.params import check_against_graph, notebook_params
from ..data.snapshots import CellGraph, load_snapshot


@dataclass
class NotebookContext:
    params: dict
    device: torch.device
    device_label: str
    graph: CellGraph | None


def setup(params_file: str | None, params: dict | None, *,
          load_graph: bool = True) -> NotebookContext:
    """Validate the parameters cell (same schema as a params file), apply the CPU allocator
    setting, set the plotting style, resolve the device and load the snapshot (checking the
    params that need it). Raises before any measurement when something is wrong."""
    p = notebook_params(params_file, params)
    environment.configure_cpu_allocator(p["cpu_allocator_cache"])
    plotting.setup()
    device = environment.resolve_device(p["device"])
    graph = None
    if load_graph:
        graph = load_snapshot(p)
        check_against_graph(p, graph.num_genes)
    return NotebookContext(p, device, environment.device_label(device), graph)
