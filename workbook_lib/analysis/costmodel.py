"""The brief's cost model, measured: timing sweeps, fitted coefficients, held-out validation.

Per layer and edge type with E edges, hidden size H and a fraction p of edges removed:

* masking      ``T_mask   = beta*E*H + alpha*E + c``
* filtering    ``T_filter = (gamma + delta)*E + beta*(1-p)*E*H + c``

``beta`` (message computation and aggregation, per edge and channel), ``alpha`` (mask
multiply, per edge) and ``c`` are fitted on masked gather-scatter layers over a sweep of (E, H);
``gamma`` (keep-mask construction with ``isin``) and ``delta`` (``nonzero`` + gather of kept
edges) on their own sweeps over E. The filter model is then *predicted*, never fitted, and
checked against measured filter layers; the masked model is checked on held-out E.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from ..strategies import sparse_ops
from ..measurement.timing import measure

COEFF_UNITS = {"alpha": "s/edge", "beta": "s/(edge*channel)", "gamma": "s/edge",
               "delta": "s/edge", "c": "s"}


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


def _bernoulli_keep(e: int, p: float, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(e, generator=g) >= p).to(device)


@dataclass
class SweepConfig:
    num_nodes: int
    edges: list[int]
    hidden: list[int]
    p: list[float]
    device: torch.device
    warmup: int = 2
    repeats: int = 5
    k_deleted: int = 3
    seed: int = 0


def sweep(cfg: SweepConfig, progress: bool = True) -> list[dict]:
    """Time every primitive of the cost model over the sweep. One row per measurement:
    ``{kind, E, H, p, median, q1, q3, n}`` with kind in masked, unmasked, keep_mask, gather,
    filter_layer, spmm."""
    rows = []
    dev = cfg.device
    n = cfg.num_nodes
    jobs = [(e, hdim) for e in cfg.edges for hdim in cfg.hidden]
    bar = tqdm(total=len(cfg.edges) * (2 + len(cfg.p)) + len(jobs) * (3 + len(cfg.p)),
               desc="cost-model sweep", disable=not progress)

    def add(kind, e, hdim, p, stats):
        rows.append({"kind": kind, "E": e, "H": hdim, "p": p, **stats.as_dict()})
        bar.update(1)

    for e in cfg.edges:
        src, dst = random_edges(n, e, cfg.seed, dev)
        deleted = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))[
            :cfg.k_deleted].to(dev)
        add("keep_mask", e, 0, 0.0, measure(
            lambda: torch.isin(src, deleted) | torch.isin(dst, deleted),
            device=dev, warmup=cfg.warmup, repeats=cfg.repeats))
        for p in cfg.p:
            keep = _bernoulli_keep(e, p, cfg.seed, dev)

            def gather(keep=keep):
                idx = keep.nonzero().squeeze(1)
                return src.index_select(0, idx), dst.index_select(0, idx)
            add("gather", e, 0, p, measure(gather, device=dev, warmup=cfg.warmup,
                                           repeats=cfg.repeats))
        add("csr_build", e, 0, 0.0, measure(
            lambda: sparse_ops.csr_from_sorted(src, dst, n, n), device=dev,
            warmup=cfg.warmup, repeats=cfg.repeats))
        for hdim in cfg.hidden:
            h = torch.randn(n, hdim, device=dev)
            w = _bernoulli_keep(e, 0.01, cfg.seed, dev)
            add("masked", e, hdim, 0.01, measure(
                lambda: sparse_ops.gather_scatter(h, src, dst, n, w), device=dev,
                warmup=cfg.warmup, repeats=cfg.repeats))
            add("unmasked", e, hdim, 0.0, measure(
                lambda: sparse_ops.gather_scatter(h, src, dst, n), device=dev,
                warmup=cfg.warmup, repeats=cfg.repeats))
            csr = sparse_ops.csr_from_sorted(src, dst, n, n)
            add("spmm", e, hdim, 0.0, measure(lambda: sparse_ops.spmm(csr, h), device=dev,
                                              warmup=cfg.warmup, repeats=cfg.repeats))
            for p in cfg.p:
                keep_p = _bernoulli_keep(e, p, cfg.seed + 1, dev)

                def filter_layer(keep_p=keep_p):
                    keep = ~(torch.isin(src, deleted) | torch.isin(dst, deleted)) & keep_p
                    idx = keep.nonzero().squeeze(1)
                    return sparse_ops.gather_scatter(h, src.index_select(0, idx),
                                                     dst.index_select(0, idx), n)
                add("filter_layer", e, hdim, p, measure(filter_layer, device=dev,
                                                        warmup=cfg.warmup, repeats=cfg.repeats))
    bar.close()
    return rows


def _nn_lstsq(x: np.ndarray, y: np.ndarray, names: list[str]) -> dict[str, float]:
    """Least squares with non-negative coefficients (drop negative terms and refit)."""
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            out = dict.fromkeys(names, 0.0)
            for i, c in zip(active, coef):
                out[names[i]] = float(max(c, 0.0))
            return out
        active = [a for a, c in zip(active, coef) if c >= 0]


def split_holdout(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Fit on every E but the largest; hold the largest E out (an extrapolation test)."""
    e_max = max(r["E"] for r in rows)
    return [r for r in rows if r["E"] != e_max], [r for r in rows if r["E"] == e_max]


def fit(rows: list[dict]) -> dict:
    """Fit alpha, beta, c (masked layers), gamma (keep mask), delta (gather) on the fit split.

    Returns ``{"alpha":..,"beta":..,"gamma":..,"delta":..,"c":..}`` in seconds per unit.
    """
    fit_rows, _ = split_holdout([r for r in rows if r["kind"] == "masked"])
    if len({r["E"] for r in fit_rows}) < 2:  # too few sizes to hold one out: fit on all
        fit_rows = [r for r in rows if r["kind"] == "masked"]
    x = np.array([[r["E"] * r["H"], r["E"], 1.0] for r in fit_rows])
    y = np.array([r["median"] for r in fit_rows])
    masked = _nn_lstsq(x, y, ["beta", "alpha", "c"])
    keep = [r for r in rows if r["kind"] == "keep_mask"]
    gamma = _nn_lstsq(np.array([[r["E"], 1.0] for r in keep]),
                      np.array([r["median"] for r in keep]), ["gamma", "c0"])["gamma"]
    gat = [r for r in rows if r["kind"] == "gather"]
    delta = _nn_lstsq(np.array([[r["E"], 1.0] for r in gat]),
                      np.array([r["median"] for r in gat]), ["delta", "c0"])["delta"]
    return {"alpha": masked["alpha"], "beta": masked["beta"], "gamma": gamma, "delta": delta,
            "c": masked["c"]}


def predict_mask(coef: dict, e: float, hdim: float) -> float:
    return coef["beta"] * e * hdim + coef["alpha"] * e + coef["c"]


def predict_filter(coef: dict, e: float, hdim: float, p: float) -> float:
    return (coef["gamma"] + coef["delta"]) * e + coef["beta"] * (1 - p) * e * hdim + coef["c"]


def crossover_p(coef: dict, hdim: float) -> float | None:
    """The p above which filtering is predicted cheaper than masking, or None if never in
    [0, 1). From ``(gamma + delta - alpha) * E < beta * p * E * H``."""
    if coef["beta"] <= 0:
        return None
    p = (coef["gamma"] + coef["delta"] - coef["alpha"]) / (coef["beta"] * hdim)
    if p < 0:
        return 0.0
    return float(p) if p < 1 else None


def validate(coef: dict, rows: list[dict]) -> dict:
    """Relative prediction error on points not used for fitting: masked layers at the
    held-out E, and every measured filter layer (the filter model is never fitted)."""
    _, held = split_holdout([r for r in rows if r["kind"] == "masked"])
    points = []
    for r in held:
        points.append({"kind": "masked", "E": r["E"], "H": r["H"], "p": r["p"],
                       "measured": r["median"], "predicted": predict_mask(coef, r["E"], r["H"])})
    for r in rows:
        if r["kind"] == "filter_layer":
            points.append({"kind": "filter", "E": r["E"], "H": r["H"], "p": r["p"],
                           "measured": r["median"],
                           "predicted": predict_filter(coef, r["E"], r["H"], r["p"])})
    errs = np.array([abs(pt["predicted"] - pt["measured"]) / pt["measured"] for pt in points])
    for pt, e in zip(points, errs):
        pt["abs_rel_error"] = float(e)
    return {"median_abs_rel": float(np.median(errs)), "max_abs_rel": float(errs.max()),
            "n_points": len(points), "points": points}
