"""Rewrites of ``tests/rewrites/lazy_dropout_gin.py`` that only run in float32, as a user's
often do: ``make_pipeline`` pools every sample's nodes into an accumulator it creates as float32
(``torch.zeros(..., dtype=torch.float32)``), so in float64 its ``index_add_`` raises;
``make_cast`` hands back its output cast to float32 (``.float()``), which runs in float64 without
an error but computes part of it in float32. ``equal`` must fall back to float32 for both, say
why, and still accept them (they compute the same function); ``make_off`` is the first with the
head's output 0.2% off, which it must still reject.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lazy_dropout_gin import LazyGIN, build  # noqa: E402


class Float32Pooling(LazyGIN):
    scale = 1.0

    def forward(self, batch, wildtype):
        x = self.nodes(batch["gene"].node_id, batch.edge_index_dict, batch.edge_mask_dict)
        index = batch["gene"].batch
        sums = torch.zeros(batch.num_graphs, x.shape[1], dtype=torch.float32, device=x.device)
        sums = sums.index_add(0, index, x)
        counts = torch.bincount(index, minlength=batch.num_graphs).clamp(min=1)
        pooled = sums / counts.unsqueeze(1)
        wt = self.nodes(wildtype["gene"].node_id, wildtype.edge_index_dict,
                        wildtype.edge_mask_dict).mean(dim=0)
        return self.scale * self.head(self.dropout(pooled - wt)).squeeze(-1)


class Float32Output(Float32Pooling):
    def forward(self, batch, wildtype):
        x = self.nodes(batch["gene"].node_id, batch.edge_index_dict, batch.edge_mask_dict)
        index = batch["gene"].batch
        sums = torch.zeros(batch.num_graphs, x.shape[1], device=x.device, dtype=x.dtype)
        pooled = sums.index_add(0, index, x) / torch.bincount(index).unsqueeze(1)
        wt = self.nodes(wildtype["gene"].node_id, wildtype.edge_index_dict,
                        wildtype.edge_mask_dict).mean(dim=0)
        return self.head(self.dropout(pooled - wt)).squeeze(-1).float()


class Float32PoolingOff(Float32Pooling):
    scale = 1.002


def make_pipeline(params, graph, device):
    return build(params, graph, device, Float32Pooling)


def make_cast(params, graph, device):
    return build(params, graph, device, Float32Output)


def make_off(params, graph, device):
    return build(params, graph, device, Float32PoolingOff)
