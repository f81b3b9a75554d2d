"""Achieved rates of the benchmark's steps against the machine's: the operators' FLOP/s and bytes/s
from a profile of one step, a dense product's rate as the reference, and the node-mask kernels
timed alone (see :mod:`.bench`)."""
from __future__ import annotations

import time

import torch

from ...measurement.timing import Stat, interleave, sync
from ...nodemask import SharedGraph
from ...nodemask.kernels import DENSE_INSIDE_TAG, MOVE_TAG, SPARSE_TAG
from ...common.progress import native_stderr_to_terminal
from ...results.bench import KernelFigure, RateFigure


_DENSE_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def achieved_rates(fn, device, variant: str, machine: dict) -> list[RateFigure]:
    """Profile one call of ``fn`` (a warm training step) and return the multiply-add rates of
    its sparse products (the ranges tagged ``SPARSE_TAG``) and of its dense matrix products
    (outside those ranges and outside ``MOVE_TAG``'s, which move rows with a product of ones),
    each beside this machine's best measured rate in ``machine``. Dense multiply-adds done
    inside a sparse kernel (``DENSE_INSIDE_TAG``: the pooled layer's weighted sums inside the
    compiled push) are counted in the dense figure's ``inside_macs``, not in its rate."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with native_stderr_to_terminal():  # the profiler's probe lines stay off the terminal
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=acts, with_flops=True) as prof:
            fn()
            sync(device)
        wall = time.perf_counter() - t0

    def dur(ev) -> float:  # microseconds
        return float(getattr(ev, "device_time_total", 0.0) if cuda else ev.cpu_time_total)

    def inside(ev, pred) -> bool:
        p = ev.cpu_parent
        while p is not None:
            if pred(p):
                return True
            p = p.cpu_parent
        return False

    def is_sparse(ev) -> bool:
        return ev.name.startswith(SPARSE_TAG)

    def is_dense(ev) -> bool:
        return ev.name in _DENSE_OPS and (ev.flops or 0) > 0

    def is_move(ev) -> bool:
        return ev.name == MOVE_TAG
    sp_macs = sp_us = de_macs = de_us = de_inside = 0.0
    for ev in prof.events():
        if ev.name.startswith(DENSE_INSIDE_TAG):
            de_inside += float(ev.name[len(DENSE_INSIDE_TAG):])
        elif is_sparse(ev) and not inside(ev, is_sparse):
            sp_macs += float(ev.name[len(SPARSE_TAG):])
            sp_us += dur(ev)
        elif is_dense(ev) and not inside(ev, lambda p: is_sparse(p) or is_dense(p)
                                         or is_move(p)):
            de_macs += ev.flops / 2.0
            de_us += dur(ev)
    out = []
    for kind, macs, us in (("sparse", sp_macs, sp_us), ("dense", de_macs, de_us)):
        if macs and us:
            out.append(RateFigure(variant, kind, macs, us * 1e-6, wall,
                                  macs / (us * 1e-6) / 1e9, machine.get(f"{kind}_gmacs"),
                                  machine.get(f"{kind}_source", ""),
                                  inside_macs=de_inside if kind == "dense" else 0.0))
    return out


def dense_probe(device, size: int) -> tuple:
    """``(fn, macs)``: a large dense matmul (``size`` cubed, float32) and its multiply-adds."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    return (lambda: a @ b), float(size) ** 3


SHAPED_BLOCKS = 8  # times each CPU worker runs its block's products in one call of the probe


def shaped_dense_probe(device, hidden: int, rows: int) -> tuple:
    """``(fn, macs)``: a linear map's three products at a converted GIN-MLP layer's own shape,
    the three the floor counts for it (:func:`workbook_lib.nodemask.floor._dense`): the forward
    ``z @ w.T + b``, the gradient at ``z``, ``g @ w``, and the weight's, ``g.T @ z``, with ``z``
    and ``g`` ``[r, hidden]`` and ``w`` ``[hidden, hidden]``, on rows as the converted form runs
    them (:func:`.convert_dense.block_rows`). On a CPU each worker of
    :func:`~workbook_lib.nodemask.workers.spread` (one compute thread each) runs its own block of
    :data:`~workbook_lib.nodemask.convert_dense.ROWS` rows, kept in cache as the form keeps a
    block while its products run, :data:`SHAPED_BLOCKS` times; where one block holds every row
    (a GPU's rule) each product runs once over them. So its rate is the best the architecture's
    own products reach on this device, which can be far below the large matmul's (on this
    project's 2-core CPUs a third to a half of it, docs/figures.md).

    Args:
        device: where the products run.
        hidden: the layer's width ``H``.
        rows: the batch's rows (``B x N``): the products' height on a GPU.

    Raises:
        ValueError: ``rows`` below 1.
    """
    from ...nodemask.convert_dense import block_rows
    from ...nodemask.workers import spread, workers

    dev = torch.device(device)
    if rows < 1:
        raise ValueError(f"rows must be positive (got {rows})")
    blk = min(block_rows(dev, rows), rows)
    one = blk == rows  # one block holds every row (a GPU's rule): each product once
    k = 1 if one else max(1, workers(dev, 2 * SHAPED_BLOCKS))  # as the step's blocks take
    times = 1 if one else SHAPED_BLOCKS
    z, g, out, gz = (torch.randn(k, blk, hidden, device=dev) for _ in range(4))
    w, gw = torch.randn(hidden, hidden, device=dev), torch.zeros(k, hidden, hidden, device=dev)
    b = torch.randn(hidden, device=dev)

    def blocks(lo: int, hi: int) -> None:
        i = lo // times  # the worker's own block: runs of `times` calls each
        for _ in range(lo, hi):
            torch.addmm(b, z[i], w.t(), out=out[i])
            torch.mm(g[i], w, out=gz[i])
            gw[i].addmm_(g[i].t(), z[i])
    return ((lambda: spread(blocks, k * times, k)),
            float(3 * k * times * blk * hidden * hidden))


def dense_rate(device, *, size: int, target: float, max_time_s: float) -> tuple[Stat, float]:
    """A large dense matmul (``size`` cubed, float32): its time and G multiply-adds/s."""
    fn, macs = dense_probe(device, size)
    res = interleave({"dense": fn}, device=device, warmup=1, min_rounds=3,
                     target=target, max_time_s=max_time_s)
    st = res.stats["dense"]
    return st, macs / st.median / 1e9


def kernel_figures(sg: SharedGraph, batch: int, hidden: int, device, *, target: float,
                   max_time_s: float, pert: torch.Tensor | None = None) -> list[KernelFigure]:
    """The per-sample product of a middle layer (every edge type, every sample) with each
    kernel tried, and (given perturbations ``pert``) the delta layer's push
    (:func:`kernel_cases`). ``used_by_step`` marks the kernels the
    shared step uses on this device: ``slabs, per type`` with the CPU's ``slab`` kernel (and
    ``slabs, stacked types``: the delta path's wildtype layers, sum aggregation), ``wide,
    int32`` with CUDA's ``wide`` one."""
    cases = kernel_cases(sg, batch, hidden, device, pert=pert)
    res = interleave({k: f for k, (_, f, _) in cases.items()}, device=device, warmup=1,
                     min_rounds=3, target=target, max_time_s=max_time_s)
    # the CPU's full middle layers take per-type slabs; its delta path's wildtype layers (sum
    # aggregation) one stacked product (kernels.stacked_aggregate_linear)
    step_kernels = ({"slabs, per type"} | ({"slabs, stacked types"} if sg.a_tt is not None
                                           and sg.aggr == "sum" else set())
                    if sg.kernel == "slab" else {"wide, int32"})
    return [KernelFigure(k, desc, res.stats[k], macs / res.stats[k].median / 1e9,
                         used_by_step=k in step_kernels or k.startswith("push"))
            for k, (desc, _, macs) in cases.items()]


def kernel_cases(sg: SharedGraph, batch: int, hidden: int, device,
                 pert: torch.Tensor | None = None, only: str | None = None) -> dict:
    """``{name: (description, fn, multiply-adds)}``: the kernels :func:`kernel_figures` times,
    each a call of the product over ``batch`` random samples (the push given ``pert``); only
    the one named ``only``, where given (its buffers alone made)."""
    n, t = sg.num_nodes, sg.num_types
    x = torch.randn(batch, n, hidden, device=device)
    a = sg.a

    def wide(int64: bool):
        wide_x = x.permute(1, 0, 2).reshape(n, batch * hidden).contiguous()
        m = torch.sparse_csr_tensor(a.crow_indices().long(), a.col_indices().long(), a.values(),
                                    size=a.shape) if int64 else a
        return lambda: torch.sparse.mm(m, wide_x)

    def slabs():
        out_s = torch.empty(batch, n * t, hidden, device=device)

        def run():
            for i in range(batch):
                out_s[i].addmm_(a, x[i], beta=0)
        return run

    def typed():
        out_t = torch.empty(batch, t, n, hidden, device=device)

        def run():
            for i in range(batch):
                for j in range(t):
                    out_t[i, j].addmm_(sg.per_type[j], x[i], beta=0)
        return run
    makers = {
        "wide, int64": ("all samples side by side [N, B*H], one product, int64 indices",
                        lambda: wide(True)),
        "wide, int32": ("[N, B*H], one product, int32 indices", lambda: wide(False)),
        "slabs, stacked types": ("one product per sample slab [N, H], all types stacked",
                                 slabs),
        "slabs, per type": ("one product per (sample, type) [N, H]: every operand "
                            "cache-sized (the CPU's 'slab' kernel)", typed),
    }
    cases = {k: (desc, make(), float(sg.num_edges * batch * hidden))
             for k, (desc, make) in makers.items() if only in (None, k)}
    if pert is not None and (only is None or only.startswith("push")):
        from ...nodemask.delta import push

        nb = sg.batch(pert.to(device) if pert.device != device else pert)
        corr = nb.corrections()
        u = torch.randn(corr.pair_gene.numel(), t, hidden, device=device)
        base = torch.zeros(n, hidden, device=device)
        w = torch.ones(batch, n * t, device=device)
        name = f"push, {nb.push_kernel}"
        cases[name] = (f"the delta layer's push: only the out-edges of the rows a deletion "
                       f"changed ({corr.plan.total_entries / batch / sg.num_edges:.0%} of the "
                       f"edges per sample here), kernel '{nb.push_kernel}' (the step's)",
                       lambda: push(sg, corr, base, u, w, nb.push_kernel),
                       float(corr.plan.total_entries * hidden))
    if only is not None and only not in cases:
        raise ValueError(f"no kernel case named {only!r} (got {sorted(cases) or 'none'})")
    return cases
