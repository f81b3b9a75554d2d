"""The floor: the fewest multiply-adds (and bytes) an exact sample needs, from a batch's deletions.

For the workbook's model (GIN-shaped layers, a weight block ``W_t`` per edge type, width ``H``,
``L >= 3`` layers, the last pooled), forward and backward, summed over a batch and divided by B,
from its :class:`~workbook_lib.nodemask.corrections.Corrections`. Each wildtype layer once per
batch; per sample: the first layer's deleted-gene messages along their out-edges; the second
layer's changed rows, mapped before or after the push per type (whichever is fewer), pushed
along their out-edges to kept receivers; layers 3 to L-1 in full on the sample's graph; the
pooled last layer's weighted sums over rows that differ from the wildtype's. Backward adds each
dense product twice and each sparse product once. A lower bound for mean aggregation. Bytes:
each product reads its operands and writes its result once (float32; int32 per sparse entry).

Counted, not profiled: a floor is what no schedule can beat, so no run can measure it.
"""
from __future__ import annotations


import torch

from ..results.floor import FloorPart, WorkFloor  # noqa: F401 (the API: nodemask.WorkFloor)


def _dense(m: float, k: int, n: int, backward: bool = True) -> tuple[float, float]:
    """(multiply-adds, bytes) of ``[m, k] @ [k, n]``, with its two gradients if ``backward``."""
    macs, byt = m * k * n, 4.0 * (m * k + k * n + m * n)
    return (3 * macs, 3 * byt) if backward else (macs, byt)


def _sparse(entries: float, width: int, rows_in: float, rows_out: float,
            backward: bool = True) -> tuple[float, float]:
    """(multiply-adds, bytes) of a sparse product over ``entries`` of ``width``-wide rows, with
    its transpose if ``backward``."""
    macs, byt = entries * width, 4.0 * (entries + width * (rows_in + rows_out))
    return (2 * macs, 2 * byt) if backward else (macs, byt)


def _part(*terms: tuple[str, tuple[float, float]]) -> FloorPart:
    sp = sum(v[0] for k, v in terms if k == "sparse")
    de = sum(v[0] for k, v in terms if k == "dense")
    return FloorPart(float(sp), float(de), float(sum(v[1] for _, v in terms)))


def _present(keys: torch.Tensor, size: int) -> torch.Tensor:
    """``[size]`` bool: which of ``0..size-1`` occur in ``keys``."""
    out = torch.zeros(size, dtype=torch.bool)
    out[keys] = True
    return out


def work_floor(graph, corr, hidden: int, layers: int, dual: bool = True) -> WorkFloor:
    """The floor of one batch (see the module docstring), on the host.

    Args:
        graph: the :class:`~workbook_lib.nodemask.graph.SharedGraph`.
        corr: the batch's corrections (:func:`~workbook_lib.nodemask.corrections.corrections`).
        hidden: H, every layer's width; ``layers``: L, at least 3.
        dual: the step also reads out the wildtype (the dual forward).

    Raises ValueError for fewer than 3 layers, a non-positive width, or corrections without the
    delta layer's lists.
    """
    if layers < 3:
        raise ValueError(f"the floor is stated for the delta path, L >= 3 (got L = {layers})")
    if hidden < 1:
        raise ValueError(f"'hidden' must be a positive integer (got {hidden})")
    if corr.plan is None or corr.source_gene is None or corr.pool_drop is None:
        raise ValueError("these corrections carry no delta lists: build them with "
                         "workbook_lib.nodemask.corrections")
    h, n, t, e = hidden, graph.num_nodes, graph.num_types, graph.num_edges
    oe = graph.out_edges
    ps, pg = corr.pair_sample.cpu(), corr.pair_gene.cpu()
    is_del = corr.pair_deleted.cpu()
    b, r = len(corr.plan.ranges) - 1, int(pg.numel())
    tau = oe.sends[:, pg].sum(0)  # the types each changed row's gene sends on
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[ps[is_del], pg[is_del]] = False
    # the deleted genes' out-edges (first layer) and in-edges (pooled weights), per sample
    out_k = torch.bincount(ps[corr.entry_slot.cpu() // t], minlength=b).double()
    drop = corr.pool_drop.cpu()
    drop_sample = drop // (t * n)
    in_k = torch.bincount(drop_sample, minlength=b).double()
    # the push: every out-edge of R_b to a kept receiver
    deg = oe.ptr[pg + 1] - oe.ptr[pg]
    total = int(deg.sum())
    first = torch.repeat_interleave(oe.ptr[pg], deg, output_size=total)
    within = torch.arange(total) - torch.repeat_interleave(torch.cumsum(deg, 0) - deg, deg,
                                                           output_size=total)
    slot = oe.slot[first + within]
    e_pair = torch.repeat_interleave(torch.arange(r), deg, output_size=total)
    e_sample = ps[e_pair]
    recv = slot // t
    live = keep[e_sample, recv]
    push_entries = float(live.sum())
    e_pair, e_sample, slot, recv = e_pair[live], e_sample[live], slot[live], recv[live]
    # per (sample, type): rows that send on it (transform before the push) against rows that
    # receive on it (transform after); the fewer of the two (presence tables, not sorts)
    sent = _present(e_pair * t + slot % t, r * t).view(r, t)
    senders = torch.zeros(b, t, dtype=torch.long).index_add_(0, ps, sent.long())
    received = _present(e_sample * (n * t) + slot, b * n * t).view(b, n, t)
    receivers = received.sum(1)
    messages = float(torch.minimum(senders, receivers).sum())
    self_rows = float(((tau < t) | is_del).sum())
    # rows of the second layer's output that differ from the wildtype: R_b and its receivers,
    changed2 = received.any(2)
    changed2[ps, pg] = True
    # and those whose pooled weight differs: the deleted genes' in-neighbours
    pooled_rows = changed2.clone().view(-1)
    pooled_rows[drop_sample * n + drop % n] = True
    g_msgs = float(oe.sends[:, corr.source_gene.cpu()].sum())
    parts: dict[str, FloorPart] = {}
    parts["layer 1 wildtype"] = _part(("sparse", _sparse(e, h, n, n * t)),
                                      ("dense", _dense(n, t * h, h)))
    parts["layer 1 changes"] = _part(("dense", _dense(g_msgs, h, h)),
                                     ("sparse", _sparse(float(out_k.sum()), h, g_msgs, r)))
    parts["layer 2 wildtype"] = _part(("sparse", _sparse(e, h, n, n * t)),
                                      ("dense", _dense(n, t * h, h)))
    parts["layer 2 changes"] = _part(("dense", _dense(messages + self_rows, h, h)),
                                     ("sparse", _sparse(push_entries, h, messages,
                                                        float(changed2.sum()))))
    middle = layers - 3  # layers 3 .. L-1, full per sample
    if middle:
        e_b = (e - out_k - in_k).clamp(min=0).sum()
        one = _part(("sparse", _sparse(float(e_b), h, b * n, b * n * t)),
                    ("dense", _dense(b * n, t * h, h)))
        parts["layers 3 to L-1, per sample"] = FloorPart(
            middle * one.sparse_macs, middle * one.dense_macs, middle * one.bytes)
        if dual:
            wt = _part(("sparse", _sparse(e, h, n, n * t)), ("dense", _dense(n, t * h, h)))
            parts["layers 3 to L-1, wildtype (dual)"] = FloorPart(
                middle * wt.sparse_macs, middle * wt.dense_macs, middle * wt.bytes)
        rows = float(b * n)  # every row has changed by then
        shared_rows = 0.0
    else:
        rows = float(pooled_rows.sum())
        shared_rows = float(n) if rows < b * n else 0.0  # the wildtype's weighted sum
    # last layer, pooled: weighted sums (forward, and the rows' gradient), its small map
    pool = (2 * t * h * (rows + shared_rows), 4.0 * 2 * (h + t) * (rows + shared_rows))
    parts["last layer, pooled"] = _part(("dense", pool), ("dense", _dense(b, t * h, h)),
                                        ("sparse", (float(drop.numel()),
                                                    4.0 * 2 * float(drop.numel()))))
    if dual:
        parts["wildtype readout (dual)"] = _part(
            ("dense", (2 * t * h * n, 4.0 * 2 * (h + t) * n)),
            ("dense", _dense(1, t * h, h)))
    return WorkFloor(batch_size=b, layers=layers, hidden=h, parts=parts)
