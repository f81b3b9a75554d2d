"""The rewrite of ``tests/rewrites/lazy_dropout_gin.py`` a user makes first: the per-sample Python
loop goes, every sample's graph of the ``Batch`` runs through the layers at once, and a sample's
pooled embedding is a ``global_mean_pool`` over the batch vector. The same parameters (the same
names), the same function: in eval mode the outputs equal the loop's. With dropout on they do
not, draw for draw: the loop drew the masks sample by sample, the rewrite draws them layer by
layer.

``make_pipeline`` is that rewrite; ``make_off`` is the same with the head's output scaled by
1.002 (a rewrite 0.2% off), which ``equal`` must reject; ``make_edge_dropout`` is the rewrite of
the model with ``dropout_edge`` as well.
"""
import sys
from pathlib import Path

from torch_geometric.nn import global_mean_pool

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lazy_dropout_gin import LazyGIN, build  # noqa: E402


class VectorizedGIN(LazyGIN):
    scale = 1.0

    def forward(self, batch, wildtype):
        x = self.nodes(batch["gene"].node_id, batch.edge_index_dict, batch.edge_mask_dict)
        pooled = global_mean_pool(x, batch["gene"].batch, size=batch.num_graphs)
        wt = self.nodes(wildtype["gene"].node_id, wildtype.edge_index_dict,
                        wildtype.edge_mask_dict).mean(dim=0)
        return self.scale * self.head(self.dropout(pooled - wt)).squeeze(-1)


class OffGIN(VectorizedGIN):
    scale = 1.002


class VectorizedGINEdgeDropout(VectorizedGIN):
    edge_dropout = 0.1


def make_pipeline(params, graph, device):
    return build(params, graph, device, VectorizedGIN)


def make_off(params, graph, device):
    return build(params, graph, device, OffGIN)


def make_edge_dropout(params, graph, device):
    return build(params, graph, device, VectorizedGINEdgeDropout)
