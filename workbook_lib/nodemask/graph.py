"""The shared graph: every edge type of the gene graph, prepared once for node-mask aggregation.

Deleting the genes ``S_b`` of sample ``b`` is a diagonal 0/1 matrix ``D_b``: ``A_b = D_b A D_b``
and ``A_b X = D_b A (D_b X)``, so every sample shares one unmodified adjacency. Prepared
(``T`` edge types, ``N`` genes): ``a`` ``[N*T, N]`` (row ``n*T + t``: gene ``n``'s type-``t``
in-edges, so ``a @ x`` is ``[N, T, H]``) and its transpose ``a_t`` (= ``out_edges``); ``a_tt``
(``slab`` only) ``[N*T, N]``, row ``j*T + t`` the receivers of gene ``j``'s type-``t``
out-edges; ``blockdiag_t``, the per-type transposes on a diagonal; wildtype ``deg`` ``[N, T]``
and ``out_deg`` ``[T, N]``; and host edge lists (:class:`OutEdges`, ``out_type_ptr``,
``out_type_node``) for the collate and the compiled push.
"""
from __future__ import annotations

import copy

import torch

from .batch import NodeMaskBatch
from .edges import OutEdges, edge_index_dict, out_edges_of
from .kernels import default_kernel, nnz, sparse_range, spmm, to_csr, transpose

AGGRS = ("sum", "mean")


class SharedGraph:
    """The gene graph, prepared once for per-sample aggregation with node masks.

    Args:
        graph: a PyG ``HeteroData`` (gene-gene edge types), or ``{edge type: edge_index [2, E]}``.
        num_nodes: number of genes N (taken from a HeteroData when not given).
        aggr: ``"sum"`` or ``"mean"``; ``device``: where the matrices live.
        allow_self_loops: keep self-loops (refused by default: GIN's ``(1 + eps) x`` would then
            count a node twice).
        kernel: ``"slab"`` or ``"wide"`` (:mod:`workbook_lib.nodemask.kernels`; default by device).

    Raises ValueError for an empty graph, node ids outside ``0..N-1``, a non-``[2, E]`` edge index,
    disallowed self-loops, an unknown aggregation or kernel.
    """

    def __init__(self, graph, num_nodes: int | None = None, *, aggr: str = "sum",
                 device: torch.device | str = "cpu", allow_self_loops: bool = False,
                 kernel: str | None = None):
        if aggr not in AGGRS:
            raise ValueError(f"'aggr' must be one of {list(AGGRS)} (got {aggr!r})")
        edges, n_found = edge_index_dict(graph)
        n = num_nodes if num_nodes is not None else n_found
        if n is None:
            raise ValueError("'num_nodes' must be given with a dict of edge indices")
        if n_found is not None and num_nodes is not None and n_found != num_nodes:
            raise ValueError(f"'num_nodes' ({num_nodes}) does not match the graph's node count "
                             f"({n_found})")
        if n <= 0:
            raise ValueError(f"'num_nodes' must be a positive integer (got {n})")
        if not edges:
            raise ValueError("the graph has no edge type")
        self.device = torch.device(device)
        self.kernel = kernel or default_kernel(self.device)
        self.aggr, self.num_nodes, self.edge_types = aggr, int(n), list(edges)
        t = len(self.edge_types)
        rows, cols = [], []
        for i, (name, ei) in enumerate(edges.items()):
            if ei.dim() != 2 or ei.shape[0] != 2:
                raise ValueError(f"edge_index of {name!r} must be [2, E] (got {list(ei.shape)})")
            ei = ei.long().cpu()
            if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
                raise ValueError(f"edge_index of {name!r} has node ids outside 0..{n - 1} "
                                 f"(min {int(ei.min())}, max {int(ei.max())})")
            loops = int((ei[0] == ei[1]).sum())
            if loops and not allow_self_loops:
                raise ValueError(
                    f"edge type {name!r} has {loops} self-loop(s). A self-loop is a message "
                    "from a gene to itself, kept while the gene is kept (as in PyG); if your "
                    "layer also adds a node's own features (GIN's (1 + eps) x), that node is "
                    "counted twice. Pass allow_self_loops=True if that is what your model does, "
                    "or remove them (torch_geometric.utils.remove_self_loops).")
            rows.append(ei[1] * t + i)  # target gene n, type i -> row n*T + i
            cols.append(ei[0])
        rows_all, cols_all = torch.cat(rows), torch.cat(cols)
        ones = torch.ones(rows_all.numel())
        self.num_edges = int(rows_all.numel())
        a = to_csr(rows_all, cols_all, ones, (n * t, n))
        self.a = a.to(self.device)
        self.a_t = transpose(a).to(self.device)
        # block-diagonal transposes: row (j, t) <- column (n, t) with A_t[n, j]
        bd_rows = cols_all * t + (rows_all % t)
        self.blockdiag_t = to_csr(bd_rows, rows_all, ones, (n * t, n * t)).to(self.device)
        # A_T [N*T, N]: row j*T + t lists the receivers of gene j's type-t out-edges (the
        # backward of the CPU kernel's stacked aggregate-linear; kernels.stacked_aggregate_linear)
        a_tt = to_csr(cols_all * t + rows_all % t, rows_all // t, ones, (n * t, n))
        self.a_tt = a_tt.to(self.device) if self.kernel == "slab" else None
        # the same lists on the host for the compiled push (receivers ascending within each)
        self.out_type_ptr = a_tt.crow_indices().long()
        self.out_type_node = a_tt.col_indices().to(torch.int32)
        # per type: A_t [N, N] and A_t^T (the CPU kernel's products)
        self.per_type, self.per_type_t = [], []
        for i in range(t):
            sel = rows_all % t == i
            m = to_csr(rows_all[sel] // t, cols_all[sel], ones[sel], (n, n))
            self.per_type.append(m.to(self.device))
            self.per_type_t.append(transpose(m).to(self.device))
        deg = torch.zeros(n * t).index_add_(0, rows_all, ones)
        self.deg = deg.view(n, t).to(self.device)
        out_deg = torch.zeros(t * n).index_add_(0, (rows_all % t) * n + cols_all, ones)
        self.out_deg = out_deg.view(t, n).to(self.device)
        # host copy of the out- and in-edge lists (the collate lists a batch's changed rows)
        self.out_edges = out_edges_of(a, n, t)
        # and on the device (the delta layer's push enumerates them there)
        self.out_ptr = self.out_edges.ptr.to(self.device)
        self.out_slot = self.out_edges.slot.to(self.device)
        self._wt_pool = None

    def with_dtype(self, dtype: torch.dtype) -> "SharedGraph":
        """This graph with its matrices and degrees in ``dtype`` (they are float32 as built),
        sharing its index lists."""
        if dtype == self.a.dtype:
            return self
        g = copy.copy(self)
        for name in ("a", "a_t", "blockdiag_t", "a_tt", "deg", "out_deg"):
            m = getattr(self, name)
            setattr(g, name, None if m is None else m.to(dtype))
        g.per_type = [m.to(dtype) for m in self.per_type]
        g.per_type_t = [m.to(dtype) for m in self.per_type_t]
        g._wt_pool = None
        return g

    @property
    def num_types(self) -> int:
        return len(self.edge_types)

    def batch(self, deleted: torch.Tensor, corrections=None, **options):
        """A :class:`NodeMaskBatch`: sample ``b`` without the genes in ``deleted[b]`` (``[B, k]``,
        -1 padded); ``corrections``, ``validate`` and ``push_kernel`` as there."""
        return NodeMaskBatch(self, deleted, corrections, **options)

    def wildtype_sums(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, T, H]``: per-type sums over in-neighbours of ``x`` ``[N, H]`` (no deletion)."""
        return spmm(self.a, self.a_t, x).view(self.num_nodes, self.num_types, x.shape[-1])

    def wildtype_aggregate(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, T, H]``: the per-type aggregation (sum or mean) of ``x`` on the whole graph."""
        s = self.wildtype_sums(x)
        return s / self.deg.clamp(min=1).unsqueeze(-1) if self.aggr == "mean" else s

    def wildtype_pool_weights(self) -> torch.Tensor:
        """``[T, N]``: ``w_t[j]`` with ``mean_n agg_t[n] = sum_j w_t[j] h[j]`` on the whole graph
        (the out-degree over N for sum aggregation; computed once)."""
        if self._wt_pool is None:
            n, t = self.num_nodes, self.num_types
            if self.aggr == "mean":
                v = (1.0 / self.deg.clamp(min=1)).reshape(n * t, 1)
                with sparse_range(nnz(self.blockdiag_t)):
                    w = torch.sparse.mm(self.blockdiag_t, v).view(n, t).T
            else:
                w = self.out_deg
            self._wt_pool = (w / n).contiguous()
        return self._wt_pool

    def pooled_layer(self, h: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None, *, eps: float = 0.0) -> torch.Tensor:
        """``[H_out]``: the mean over genes of a last (linear) GIN-shaped layer's output on the
        whole graph for ``h`` ``[N, H]``, as weighted sums of rows (the dual forward's readout)."""
        if h.dim() != 2 or h.shape[0] != self.num_nodes:
            raise ValueError(f"features must be [N, H] with N={self.num_nodes} "
                             f"(got {list(h.shape)})")
        t = self.num_types
        pooled = self.wildtype_pool_weights() @ h  # [T, H]
        wsum = weight.view(weight.shape[0], t, -1).sum(1)
        out = pooled.reshape(-1) @ weight.T + (1.0 + eps) * (h.mean(dim=0) @ wsum.T)
        return out + bias if bias is not None else out

    def __repr__(self) -> str:
        return (f"SharedGraph({self.num_nodes:,} nodes, {self.num_types} edge types, "
                f"{self.num_edges:,} edges, aggr={self.aggr!r}, device={self.device}, "
                f"kernel={self.kernel!r})")
