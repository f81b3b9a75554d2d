"""The fix as a public API: per-sample message passing on one shared graph with node masks,
in place of B copies of the gene graph with an edge mask per sample::

    from workbook_lib.nodemask import SharedGraph

    graph = SharedGraph(cell_graph, aggr="sum", device="cuda")  # once: HeteroData or edge dict
    batch = graph.batch(deleted)        # per batch: [B, k] deleted-gene indices, -1 padded
    agg = batch.aggregate(h)            # [B, N, T, H] per-sample aggregation of h [B, N, H]
    h1 = batch.first_layer_delta(x0, W1, b1)  # shared input x0 [N, H]: wildtype + changed rows
    h2 = batch.delta_layer(h1, W2, b2)  # [B, N, H]: per sample, work on the changed rows only
    out = batch.pooled_layer(h2, W3, b3)  # [B, H]: the mean over genes of a last linear layer
    fast = convert(encoder, cell_graph, readout="mean_kept")  # a user's PyG encoder, exact

Exact (float32 rounding) for sum and mean aggregation, forward and gradients; the identities and
their conditions are in :mod:`workbook_lib.nodemask.batch`.
"""
from .convert import ConvertedEncoder, convert
from .convert_trace import ConvertError
from .batch import DeltaFeatures, NodeMaskBatch, SharedAggregation
from .corrections import Corrections, corrections, validate_deleted
from .delta import PUSH_KERNELS, default_push_kernel, grouped_messages, push
from .floor import WorkFloor, work_floor
from .graph import OutEdges, SharedGraph
from .kernels import KERNELS, batched_spmm

__all__ = ["SharedGraph", "NodeMaskBatch", "SharedAggregation", "DeltaFeatures", "Corrections",
           "corrections", "validate_deleted", "OutEdges", "batched_spmm", "KERNELS", "push",
           "PUSH_KERNELS", "default_push_kernel", "grouped_messages", "work_floor", "WorkFloor",
           "convert", "ConvertedEncoder", "ConvertError"]
