"""The investigation's cost model of one layer and edge type, fitted and checked.

Proposed (E edges, hidden size H, fraction p of edges removed): masking ``T_mask = beta*E*H +
alpha*E``, filtering ``T_filter = (gamma + delta)*E + beta*(1-p)*E*H``. Each coefficient is fitted
by plain least squares from primitives timed interleaved (``beta``: unmasked layers; ``alpha``:
masked minus unmasked, per edge or per message element, whichever fits better; ``gamma``: the
keep-mask; ``delta``: ``nonzero`` and the gather). The largest E is held out of every fit as the
check, and the predicted crossover p is compared with direct timings (docs/development.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...measurement.timing import Stat, interleave
from ...strategies import sparse_ops
from ...results.mask_cost import (COEFFICIENTS, CostModel, CrossoverCheck, Fit,  # noqa: F401
                                  SweepPoint)


def random_edges(num_nodes: int, num_edges: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``num_edges`` uniform random directed edges (src, dst), sorted by dst."""
    if num_edges <= 0:
        raise ValueError(f"'num_edges' must be a positive integer (got {num_edges})")
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    order = torch.argsort(dst, stable=True)
    return src[order].to(device), dst[order].to(device)


def _keep(e: int, p: float, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(e, generator=g) >= p).to(device)


@dataclass
class SweepConfig:
    num_nodes: int
    edges: list[int]
    hidden: list[int]
    p: list[float]
    device: torch.device
    warmup: int = 1
    min_rounds: int = 5
    target: float = 0.10
    max_time_s: float = 60.0
    k_deleted: int = 3
    seed: int = 0


def sweep(cfg: SweepConfig) -> list[SweepPoint]:
    """Time every primitive at every (E, H, p), all interleaved in the same rounds."""
    dev, n = cfg.device, cfg.num_nodes
    fns, meta = {}, {}
    deleted = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))[
        :cfg.k_deleted].to(dev)
    for e in cfg.edges:
        src, dst = random_edges(n, e, cfg.seed, dev)
        fns[f"keep_mask/{e}"] = (lambda s=src, d=dst: torch.isin(s, deleted) |
                                 torch.isin(d, deleted))
        meta[f"keep_mask/{e}"] = ("keep_mask", e, 0, 0.0)
        for p in cfg.p:
            keep = _keep(e, p, cfg.seed, dev)

            def gather(keep=keep, s=src, d=dst):
                idx = keep.nonzero().squeeze(1)
                return s.index_select(0, idx), d.index_select(0, idx)
            fns[f"gather/{e}/{p}"] = gather
            meta[f"gather/{e}/{p}"] = ("gather", e, 0, p)
        for hd in cfg.hidden:
            h = torch.randn(n, hd, device=dev)
            w = _keep(e, 0.01, cfg.seed, dev)
            csr = sparse_ops.csr_from_sorted(src, dst, n, n)
            fns[f"masked/{e}/{hd}"] = (lambda h=h, s=src, d=dst, w=w:
                                       sparse_ops.gather_scatter(h, s, d, n, w))
            fns[f"unmasked/{e}/{hd}"] = (lambda h=h, s=src, d=dst:
                                         sparse_ops.gather_scatter(h, s, d, n))
            fns[f"spmm/{e}/{hd}"] = lambda c=csr, h=h: sparse_ops.spmm(c, h)
            for kind in ("masked", "unmasked", "spmm"):
                meta[f"{kind}/{e}/{hd}"] = (kind, e, hd, 0.01 if kind == "masked" else 0.0)
            for p in cfg.p:
                keep_p = _keep(e, p, cfg.seed + 1, dev)

                def filter_layer(keep_p=keep_p, h=h, s=src, d=dst):
                    keep = ~(torch.isin(s, deleted) | torch.isin(d, deleted)) & keep_p
                    idx = keep.nonzero().squeeze(1)
                    return sparse_ops.gather_scatter(h, s.index_select(0, idx),
                                                     d.index_select(0, idx), n)
                fns[f"filter/{e}/{hd}/{p}"] = filter_layer
                meta[f"filter/{e}/{hd}/{p}"] = ("filter_layer", e, hd, p)
    res = interleave(fns, device=dev, warmup=cfg.warmup, min_rounds=cfg.min_rounds,
                     target=cfg.target, max_time_s=cfg.max_time_s)
    out = [SweepPoint(*meta[k], res.stats[k]) for k in fns]
    for e in cfg.edges:  # the mask multiply itself: masked - unmasked, paired by round
        for hd in cfg.hidden:
            a, b = res.stats[f"masked/{e}/{hd}"], res.stats[f"unmasked/{e}/{hd}"]
            diff = Stat.from_samples([x - y for x, y in zip(a.samples, b.samples)],
                                     target=cfg.target)
            out.append(SweepPoint("mask_cost", e, hd, 0.01, diff))
    return out


def _design(term: str, pt: SweepPoint) -> float:
    return {"E*H": pt.E * pt.H, "E": pt.E, "1": 1.0}[term]


def _fit(name: str, pts: list[SweepPoint], terms: list[str], coef_names: list[str],
         held_e: int) -> Fit:
    fit_pts = [p for p in pts if p.E != held_e]
    held = [p for p in pts if p.E == held_e]
    x = np.array([[_design(t, p) for t in terms] for p in fit_pts])
    y = np.array([p.stat.median for p in fit_pts])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)

    def pred(p):
        return float(sum(c * _design(t, p) for c, t in zip(coef, terms)))

    def rel(ps):
        errs = [abs(pred(p) - p.stat.median) / abs(p.stat.median) for p in ps
                if p.stat.median]
        return float(np.median(errs)) if errs else None
    named = {c: float(v) for c, v in zip(coef_names, coef)}
    stderr = {}
    dof = len(fit_pts) - len(terms)
    if dof > 0:  # ordinary least squares: cov = s^2 (X^T X)^-1, s^2 = RSS / dof
        s2 = float(np.sum((y - x @ coef) ** 2)) / dof
        cov = s2 * np.linalg.pinv(x.T @ x)
        stderr = {c: float(np.sqrt(max(cov[i, i], 0.0))) for i, c in enumerate(coef_names)}
    noise = [p.stat.iqr / p.stat.median for p in fit_pts if p.stat.median > 0]
    return Fit(name, terms, named, len(fit_pts), rel(fit_pts) or 0.0, len(held), rel(held),
               [c for c, v in named.items() if v < 0 and c != "c"], stderr,
               float(np.median(noise)) if noise else None)


def fit(points: list[SweepPoint]) -> CostModel:
    """Fit every coefficient with the largest E held out of each fit."""
    held_e = max(p.E for p in points)

    def kind(k):
        return [p for p in points if p.kind == k]
    beta = _fit("unmasked layer", kind("unmasked"), ["E*H", "E", "1"], ["beta", "beta_e", "c"],
                held_e)
    # the mask multiply: one term through the origin, E*H (per message element) or E (per
    # edge); the one with the smaller in-fit residual carries it (both are kept)
    per_el = _fit("mask multiply (masked - unmasked), per element", kind("mask_cost"), ["E*H"],
                  ["alpha_eh"], held_e)
    per_edge = _fit("mask multiply (masked - unmasked), per edge", kind("mask_cost"), ["E"],
                    ["alpha_e"], held_e)
    alpha = per_el if per_el.in_fit_median_abs_rel <= per_edge.in_fit_median_abs_rel \
        else per_edge
    alpha.coefficients = {"alpha_eh": 0.0, "alpha_e": 0.0, **alpha.coefficients}
    alpha_other = per_edge if alpha is per_el else per_el
    gamma = _fit("keep mask", kind("keep_mask"), ["E", "1"], ["gamma", "c0"], held_e)
    delta = _fit("gather of kept edges", kind("gather"), ["E", "1"], ["delta", "c0"], held_e)
    carrier = "E*H" if alpha is per_el else "E"
    probe = CostModel(beta, alpha, gamma, delta, held_e, beta, carrier, alpha_other)

    def rel_errs(sel):
        return [abs(probe.predict_filter(p.E, p.H, p.p) - p.stat.median) / p.stat.median
                for p in kind("filter_layer") if sel(p)]
    errs_in, errs_out = rel_errs(lambda p: p.E != held_e), rel_errs(lambda p: p.E == held_e)
    check = Fit("filter layer (predicted from beta, beta_e, gamma, delta; never fitted)", [], {},
                len(errs_in), float(np.median(errs_in)) if errs_in else 0.0, len(errs_out),
                float(np.median(errs_out)) if errs_out else None)
    return CostModel(beta, alpha, gamma, delta, held_e, check, carrier, alpha_other)


def crossover_checks(model: CostModel, points: list[SweepPoint]) -> list[CrossoverCheck]:
    """At every swept (E, H): does the predicted crossover put each swept p on the side the
    direct timings show?"""
    out = []
    masked = {(p.E, p.H): p.stat for p in points if p.kind == "masked"}
    for (e, h), m in sorted(masked.items()):
        filt = sorted((p.p, p.stat.median / m.median) for p in points
                      if p.kind == "filter_layer" and p.E == e and p.H == h)
        pred = model.crossover_p(h)
        measured_p = next((p for p, r in filt if r < 1.0), None)
        agrees = all((r < 1.0) == (pred is not None and p >= pred) for p, r in filt)
        out.append(CrossoverCheck(e, h, pred, dict(filt), measured_p, agrees))
    return out
