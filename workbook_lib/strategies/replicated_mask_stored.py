"""Strategy 3: strategy 2 with the masks precomputed once and read from storage per item."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from ..strategies.replicated_mask_cpu import ReplicatedMaskCPU


class ReplicatedMaskStored(ReplicatedMaskCPU):
    name = "replicated_mask_stored"
    label = "3 replicated + masks stored on disk"
    title = "replicated masks read from disk"
    number = 3

    def __init__(self, graph, *, storage_dir: str | Path | None = None, **kw):
        super().__init__(graph, **kw)
        self.storage_dir = Path(storage_dir) if storage_dir else None
        self.store_path: Path | None = None
        self._mm = None

    def store(self, perts: torch.Tensor) -> Path:
        """Precompute the masks of every perturbation (row i = dataset item i) into one
        ``[n, E_total]`` bool memmap file; returns its path."""
        self.prepare()
        d = self.storage_dir or Path(tempfile.mkdtemp(prefix="masks-"))
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"masks-{self.graph.checksum[:12]}-{len(perts)}.bool"
        total = self.graph.num_edges()
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.bool_,
                                       shape=(len(perts), total))
        for i, row in enumerate(perts):
            masks = self.masks_for(row)
            mm[i] = torch.cat([masks[t] for t in self.graph.edge_types]).numpy()
        mm.flush()
        del mm
        self.store_path = path
        self._mm = None
        return path

    def make_item(self, index, pert_row):
        if self.store_path is None:
            raise RuntimeError("call store(perturbations) before reading stored masks")
        if self._mm is None:  # opened lazily, once per worker process
            self._mm = np.load(self.store_path, mmap_mode="r")
        flat = torch.from_numpy(np.array(self._mm[index]))
        masks, start = {}, 0
        for t in self.graph.edge_types:
            e = self.graph.num_edges(t)
            masks[t] = flat[start:start + e]
            start += e
        return {"index": index, "pert": pert_row, "masks": masks}

    def __getstate__(self):  # a memmap handle does not cross process boundaries
        state = super().__getstate__()
        state["_mm"] = None
        return state
