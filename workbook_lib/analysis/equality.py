"""Does a rewrite compute the same thing as the pipeline it replaces? (``python -m workbook_lib
equal SLOW FAST``; notebook 06 runs the same check before it trains.)

A user who rewrites a slow pipeline (e.g. with :mod:`workbook_lib.nodemask`) must know the rewrite
computes the same model before its speed means anything. The check:

1. builds both pipelines from the same seed (``params["seed"]``, set before each factory call);
2. maps the slow model's parameters to the fast model's by name (an explicit ``OLD=NEW`` rename
   per parameter or module prefix where the rewrite names them differently) and refuses, naming
   both sides, when a parameter is missing, extra or of another shape
   (:class:`ParameterMismatchError`, a bad input: exit 2);
3. copies the slow model's parameters (and its same-named, same-shaped buffers) into the fast one,
   so the two start from the very same numbers whatever their initialisation;
4. runs the same batch(es) through both, each through its own stages (dataset items ``i*B`` to
   ``(i+1)*B - 1``, collate, transfer, prepare, forward, loss, backward: the seam of
   :mod:`workbook_lib.pipelines.protocol`), in training mode, the global RNG reset to the seed
   before each forward;
5. compares the outputs, the loss and every mapped parameter's gradient.

The rule, per tensor (the outputs, the loss, each parameter's gradient): the rewrite's tensor is
*equal* when ``max|fast - slow| <= allowed``, with

    allowed = max(tol * max(max|slow|, max|fast|),  max|probe - slow|)

``tol`` is the float32 bound of :func:`workbook_lib.measurement.precision.float32_tolerance`
(sums over up to ``d`` neighbours, the graph's largest in-degree over the edge types, in another
order, over ``layers`` layers, with a margin; never below 2e-5). ``probe`` is the slow pipeline run
again on the same batch with every module's output rounded at that same relative size
(:class:`~workbook_lib.measurement.precision.rounding_probe`, seeded): a tensor's own size is no
scale for its rounding when it is the difference of two large terms (the Lazy model's dual forward
subtracts the wildtype pass, and the last layer's bias gradient is exactly 0 in exact arithmetic),
the probe moves it as much as rounding moves those terms. Shapes that differ (other than ``[B]``
against ``[B, 1]``), a gradient on one side only, or a non-finite value on either side are
*different*; both sides without a gradient are equal. Differences are taken in float64.

Written here rather than with ``torch.testing.assert_close``: that raises on the first tensor
with an element-wise ``atol + rtol * |expected|`` rule, where this must report every tensor of the
pair in one table, against a tolerance derived from the graph and a rounding probe of the
pipeline itself (rounding that cancellation magnifies is not a difference).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..exceptions import WorkbookError
from ..records import Record


class ParameterMismatchError(WorkbookError, ValueError):
    """The two models' parameters cannot be paired by name (a bad input: nothing was run).

    Attributes:
        missing: slow-model parameters the fast model lacks (after renames).
        extra: fast-model parameters no slow-model parameter maps to.
        shapes: ``{slow name: (slow shape, fast name, fast shape)}`` where they differ.
    """

    def __init__(self, message: str, *, missing=(), extra=(), shapes=None):
        super().__init__(message)
        self.missing, self.extra, self.shapes = list(missing), list(extra), dict(shapes or {})


@dataclass
class TensorDiff(Record):
    """One compared tensor of the pair.

    Attributes:
        name: ``output``, ``output[0]``, ``loss``, or the (slow model's) parameter name.
        kind: ``output``, ``loss`` or ``gradient``.
        max_abs_diff: ``max|fast - slow|`` (NaN when not comparable).
        scale: ``max(max|slow|, max|fast|)``.
        rel_diff: ``max_abs_diff / scale`` (0 when both are exactly equal, inf when not
            comparable).
        probe: ``max|probe - slow|``, how far the rounding probe moved the slow side (NaN
            without a probe).
        allowed: ``max(tol * scale, probe)`` (the rule of the module docstring).
        ratio: ``max_abs_diff / allowed`` (at most 1: equal; inf when not comparable).
        equal: within the rule.
        note: why it is not comparable, or what is special (shapes, no gradient).
        fast_name: the fast model's name of a gradient's parameter, where it differs.
    """

    name: str
    kind: str
    max_abs_diff: float
    scale: float
    rel_diff: float
    probe: float
    allowed: float
    ratio: float
    equal: bool
    note: str = ""
    fast_name: str = ""


@dataclass
class EqualityResult(Record):
    """Both pipelines on the same batch(es), every output, loss and gradient compared.

    Attributes:
        slow, fast: the two pipelines' names.
        tolerance: the relative tolerance of the rule (module docstring).
        tolerance_basis: how it was derived, in words.
        batch_size: samples per compared batch (the slow pipeline's).
        batches: how many batches were compared (each row: the largest over them).
        renames: the explicit ``slow name -> fast name`` renames applied.
        rows: one per compared tensor.
        buffers_copied: buffers copied from the slow model (same name and shape).
        buffers_not_copied: buffers of the fast model that had no same-named, same-shaped
            buffer in the slow model (left as the fast model built them).
        device: where both ran.
    """

    slow: str
    fast: str
    tolerance: float
    tolerance_basis: str
    batch_size: int
    batches: int
    renames: dict[str, str] = field(default_factory=dict)
    rows: list[TensorDiff] = field(default_factory=list)
    buffers_copied: list[str] = field(default_factory=list)
    buffers_not_copied: list[str] = field(default_factory=list)
    device: str = ""

    @property
    def equal(self) -> bool:
        return bool(self.rows) and all(r.equal for r in self.rows)

    @property
    def differing(self) -> list[TensorDiff]:
        return [r for r in self.rows if not r.equal]

    @property
    def worst(self) -> TensorDiff | None:
        """The row furthest from its tolerance (a not comparable one first)."""
        if not self.rows:
            return None
        return max(self.rows, key=lambda r: r.ratio)

    def summary(self) -> str:
        """One sentence: equal or not, and the largest difference."""
        w = self.worst
        if self.equal:
            return (f"'{self.fast}' computes the same as '{self.slow}': outputs, loss and "
                    f"{sum(r.kind == 'gradient' for r in self.rows)} parameter gradients within "
                    f"float32 rounding (tolerance {self.tolerance:.1e}; the closest to its limit:"
                    f" {w.name}, {w.ratio:.2g} of it)")
        bad = self.differing
        names = ", ".join(r.name for r in bad[:6]) + (f" and {len(bad) - 6} more"
                                                      if len(bad) > 6 else "")
        worst = (w.note if w.note else f"{w.ratio:.3g}x the allowed difference, "
                 f"{w.rel_diff:.2e} of its size")
        return (f"'{self.fast}' does NOT compute the same as '{self.slow}': {len(bad)} of "
                f"{len(self.rows)} tensors differ beyond float32 rounding ({names}; the "
                f"largest: {w.name}, {worst})")


# ------------------------------------------------------------------ parameter names
def parse_renames(entries: list[str] | None) -> dict[str, str]:
    """``["OLD=NEW", ...]`` as a dict; OLD is a slow-model parameter name or module prefix.

    Args:
        entries: the ``--map`` values.

    Raises:
        ValueError: an entry without ``=``, an empty side, or OLD given twice.
    """
    out: dict[str, str] = {}
    for e in entries or []:
        old, sep, new = (s.strip() for s in e.partition("="))
        if not sep or not old or not new:
            raise ValueError(f"--map expects SLOW_NAME=FAST_NAME (got {e!r})")
        if old in out:
            raise ValueError(f"--map names {old!r} twice")
        out[old] = new
    return out


def _renamed(name: str, renames: dict[str, str]) -> str:
    """``name`` under the longest matching rename (a whole name or a module prefix)."""
    best = ""
    for old in renames:
        if (name == old or name.startswith(old + ".")) and len(old) > len(best):
            best = old
    return renames[best] + name[len(best):] if best else name


def parameter_mapping(slow: torch.nn.Module, fast: torch.nn.Module,
                      renames: dict[str, str] | None = None, *, slow_label: str = "slow",
                      fast_label: str = "fast") -> dict[str, str]:
    """``{slow parameter name: fast parameter name}`` covering both models' parameters.

    Args:
        slow: the reference model.
        fast: the rewrite.
        renames: ``{slow name or prefix: fast name or prefix}`` where the rewrite names a
            parameter differently (default: none, every name must match).
        slow_label, fast_label: the pipelines' names, for the error.

    Raises:
        ParameterMismatchError: a slow parameter without a fast one, a fast parameter nothing
            maps to, a shape that differs, or a rename that matches no parameter.
    """
    renames = renames or {}
    sp, fp = dict(slow.named_parameters()), dict(fast.named_parameters())
    unused = [o for o in renames if not any(n == o or n.startswith(o + ".") for n in sp)]
    if unused:
        raise ParameterMismatchError(
            f"--map {', '.join(unused)}: no parameter of '{slow_label}' has that name or prefix "
            f"(its parameters: {_names(sp)})")
    mapping = {n: _renamed(n, renames) for n in sp}
    missing = [n for n, m in mapping.items() if m not in fp]
    extra = sorted(set(fp) - set(mapping.values()))
    shapes = {n: (list(sp[n].shape), m, list(fp[m].shape)) for n, m in mapping.items()
              if m in fp and sp[n].shape != fp[m].shape}
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"only '{slow_label}' has " + _names(
                [n if mapping[n] == n else f"{mapping[n]} (renamed from {n})" for n in missing]))
        if extra:
            parts.append(f"only '{fast_label}' has {_names(extra)}")
        if shapes:
            parts.append("shapes differ: " + ", ".join(
                f"{n} {a} vs {m} {b}" for n, (a, m, b) in shapes.items()))
        raise ParameterMismatchError(
            "the parameters do not pair by name: " + "; ".join(parts)
            + ". Pair them with --map SLOW_NAME=FAST_NAME (a name or a module prefix)",
            missing=missing, extra=extra, shapes=shapes)
    return mapping


def _names(names, limit: int = 8) -> str:
    """Names, those under one top-level module grouped (``lins.* (4)``), so that an error line
    names both sides whole."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.split(".", 1)[0] if "." in n else n, []).append(n)
    parts = [g[0] if len(g) == 1 else f"{k}.* ({len(g)})" for k, g in groups.items()]
    return ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if len(parts) > limit
                                       else "")


def copy_parameters(slow: torch.nn.Module, fast: torch.nn.Module,
                    mapping: dict[str, str]) -> tuple[list[str], list[str]]:
    """Copy the slow model's parameters into the fast one (``mapping`` from
    :func:`parameter_mapping`), and its buffers of the same name and shape; returns
    ``(buffers copied, fast buffers not copied)``."""
    sp, fp = dict(slow.named_parameters()), dict(fast.named_parameters())
    sb, fb = dict(slow.named_buffers()), dict(fast.named_buffers())
    copied, not_copied = [], []
    with torch.no_grad():
        for n, m in mapping.items():
            fp[m].copy_(sp[n].to(fp[m].device, fp[m].dtype))
        for n, b in fb.items():
            if n in sb and sb[n].shape == b.shape:
                b.copy_(sb[n].to(b.device, b.dtype))
                copied.append(n)
            else:
                not_copied.append(n)
    return copied, not_copied


# ------------------------------------------------------------------ comparing tensors
def compare_tensors(name: str, kind: str, slow: torch.Tensor | None, fast: torch.Tensor | None,
                    tolerance: float, *, probe: torch.Tensor | None = None,
                    fast_name: str = "") -> TensorDiff:
    """One row of the table: ``fast`` against ``slow`` under the rule of the module docstring.

    Args:
        name: the row's name.
        kind: ``output``, ``loss`` or ``gradient``.
        slow, fast: the two tensors (None: no gradient on that side).
        tolerance: relative tolerance (> 0).
        probe: the slow side under the rounding probe (None: no probe, ``tol * scale`` alone).
        fast_name: the fast side's name where it differs.
    """
    if not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
    nan, inf = math.nan, math.inf

    def bad(note: str) -> TensorDiff:
        return TensorDiff(name, kind, nan, nan, inf, nan, nan, inf, False, note, fast_name)

    if slow is None or fast is None:
        if slow is None and fast is None:
            return TensorDiff(name, kind, 0.0, 0.0, 0.0, nan, 0.0, 0.0, True,
                              "no gradient on either side", fast_name)
        return bad(f"a gradient only in the {'slow' if fast is None else 'fast'} model")
    a, b = slow.detach().double().cpu(), fast.detach().double().cpu()
    if a.shape != b.shape:
        if a.numel() == b.numel() and a.squeeze().shape == b.squeeze().shape:
            b = b.reshape(a.shape)  # [B] against [B, 1]: the same values
        else:
            return bad(f"shapes {list(a.shape)} and {list(b.shape)}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return bad("non-finite values")
    if a.numel() == 0:
        return TensorDiff(name, kind, 0.0, 0.0, 0.0, nan, 0.0, 0.0, True, "empty", fast_name)
    diff = float((a - b).abs().max())
    scale = float(torch.maximum(a.abs().max(), b.abs().max()))
    moved = nan
    if probe is not None:
        pr = probe.detach().double().cpu().reshape(a.shape)
        if torch.isfinite(pr).all():
            moved = float((pr - a).abs().max())
    allowed = max(tolerance * scale, 0.0 if math.isnan(moved) else moved)
    ratio = 0.0 if diff == 0 else (diff / allowed if allowed > 0 else inf)
    return TensorDiff(name, kind, diff, scale, 0.0 if diff == 0 else diff / scale, moved,
                      allowed, ratio, ratio <= 1.0, "", fast_name)


def _leaves(x: Any, prefix: str) -> dict[str, torch.Tensor] | None:
    """The tensors of an output (a tensor, or tuples/lists/dicts of them) by name; None when it
    holds none."""
    if isinstance(x, torch.Tensor):
        return {prefix: x}
    out: dict[str, torch.Tensor] = {}
    items = (x.items() if isinstance(x, dict) else enumerate(x)
             if isinstance(x, (list, tuple)) else ())
    for k, v in items:
        sub = _leaves(v, f"{prefix}[{k}]")
        if sub:
            out.update(sub)
    return out or None


def _run(pipe, batch_index: int, batch_size: int, seed: int, probe: float | None = None):
    """One batch through every stage of ``pipe``: ``(output, loss, {parameter: gradient})``;
    with ``probe``, every module's output rounded at that relative size."""
    from ..measurement.precision import rounding_probe

    ds = pipe.dataset()
    lo = batch_index * batch_size
    items = [ds[i] for i in range(lo, lo + batch_size)]
    batch = pipe.to_device(pipe.collate(items), False)
    inputs = pipe.prepare(batch)
    pipe.model.train()
    pipe.model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout draws, where both draw in the same order
    with (rounding_probe(pipe.model, probe) if probe else contextlib.nullcontext()):
        out = pipe.forward(pipe.model, inputs)
    loss = pipe.loss(out, batch)
    loss.backward()
    grads = {n: (None if p.grad is None else p.grad.detach().clone())
             for n, p in pipe.model.named_parameters()}
    pipe.model.zero_grad(set_to_none=True)
    return _detach(out), loss.detach(), grads


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_detach(v) for v in x]
    return x


def check_pipelines(slow, fast, *, tolerance: float, tolerance_basis: str, seed: int = 0,
                    renames: dict[str, str] | None = None, batches: int = 1,
                    batch_size: int | None = None) -> EqualityResult:
    """Steps 2-5 of the module docstring on two built pipelines (the fast model's parameters are
    overwritten with the slow model's; both models' gradients are cleared afterwards).

    Args:
        slow: the reference pipeline.
        fast: the rewrite.
        tolerance: the rule's relative tolerance.
        tolerance_basis: how it was derived (for the report).
        seed: the RNG seed set before each forward.
        renames: slow name (or prefix) -> fast name, see :func:`parameter_mapping`.
        batches: how many batches to compare (the first ones of each dataset).
        batch_size: samples per batch (default: the slow pipeline's).

    Raises:
        ParameterMismatchError: the parameters do not pair.
        ValueError: ``batches`` or ``batch_size`` not positive, or a dataset too small.
    """
    b = batch_size or slow.batch_size
    if not isinstance(batches, int) or batches <= 0:
        raise ValueError(f"'batches' must be a positive integer (got {batches!r})")
    if not isinstance(b, int) or b <= 0:
        raise ValueError(f"'batch_size' must be a positive integer (got {b!r})")
    for p in (slow, fast):
        n = len(p.dataset())
        if n < batches * b:
            raise ValueError(f"the dataset of '{p.name}' holds {n} items, fewer than {batches} "
                             f"batch(es) of {b}")
    mapping = parameter_mapping(slow.model, fast.model, renames, slow_label=slow.name,
                                fast_label=fast.name)
    copied, not_copied = copy_parameters(slow.model, fast.model, mapping)
    worst: dict[str, TensorDiff] = {}

    def keep(row: TensorDiff) -> None:
        old = worst.get(row.name)
        if old is None or (not row.equal and old.equal) or (
                row.equal == old.equal and row.ratio > old.ratio):
            worst[row.name] = row

    for i in range(batches):
        out_s, loss_s, grad_s = _run(slow, i, b, seed)
        out_p, loss_p, grad_p = _run(slow, i, b, seed, probe=tolerance)
        out_f, loss_f, grad_f = _run(fast, i, b, seed)
        ls, lp, lf = (_leaves(o, "output") for o in (out_s, out_p, out_f))
        if ls is None or lf is None or set(ls) != set(lf):
            keep(TensorDiff("output", "output", math.nan, math.nan, math.inf, math.nan,
                            math.nan, math.inf, False, f"outputs of another structure "
                            f"({_structure(ls)} and {_structure(lf)})"))
        else:
            for k in ls:
                keep(compare_tensors(k, "output", ls[k], lf[k], tolerance,
                                     probe=(lp or {}).get(k)))
        keep(compare_tensors("loss", "loss", loss_s, loss_f, tolerance, probe=loss_p))
        for n, m in mapping.items():
            keep(compare_tensors(n, "gradient", grad_s[n], grad_f[m], tolerance,
                                 probe=grad_p[n], fast_name=m if m != n else ""))
    return EqualityResult(slow=slow.name, fast=fast.name, tolerance=tolerance,
                          tolerance_basis=tolerance_basis, batch_size=b, batches=batches,
                          renames=dict(renames or {}), rows=list(worst.values()),
                          buffers_copied=copied, buffers_not_copied=not_copied,
                          device=str(torch.device(fast.device)))


def _structure(leaves: dict | None) -> str:
    return "no tensor" if leaves is None else ", ".join(leaves)


def equality_tolerance(graph, layers: int) -> tuple[float, str]:
    """The rule's tolerance for ``graph`` and ``layers`` and its basis in words."""
    from ..measurement.precision import float32_tolerance

    tol = float32_tolerance(graph, layers)
    return tol, (f"float32 sums in another order: 32 x eps x sqrt(largest in-degree) x "
                 f"{layers} layers, at least 2e-5 ({tol:.1e})")


def seeded_build(params: dict, name: str, graph, device, **kw):
    """:func:`workbook_lib.pipelines.build_pipeline` with torch's (and Python's and numpy's)
    RNG set to ``params["seed"]`` first, so that two pipelines start from the same draws."""
    import random

    import numpy as np

    from ..pipelines import build_pipeline

    random.seed(params["seed"])
    np.random.seed(params["seed"] % 2 ** 32)
    torch.manual_seed(params["seed"])
    return build_pipeline(params, name, graph, device, **kw)


def check_equal(params: dict, slow: str, fast: str, graph, device, *,
                renames: dict[str, str] | None = None, batches: int = 1,
                batch_size: int | None = None,
                tolerance: float | None = None) -> EqualityResult:
    """Build ``slow`` and ``fast`` (built-in strategy names or entries of
    ``params["pipelines"]``) from the same seed and compare them (:func:`check_pipelines`).

    Args:
        params: validated params (``seed``, ``layers`` and the pipelines' own keys).
        slow, fast: the pipelines' names.
        graph: the loaded snapshot.
        device: where both run.
        renames, batches, batch_size: see :func:`check_pipelines`.
        tolerance: the rule's tolerance (default :func:`equality_tolerance`).
    """
    if slow == fast:
        raise ValueError(f"compare two different pipelines (got {slow!r} twice)")
    s = seeded_build(params, slow, graph, device)
    f = seeded_build(params, fast, graph, device)
    if tolerance is None:
        tol, basis = equality_tolerance(graph, params["layers"])
    else:
        if not tolerance > 0:
            raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
        tol, basis = tolerance, f"given ({tolerance:.1e})"
    return check_pipelines(s, f, tolerance=tol, tolerance_basis=basis, seed=params["seed"],
                           renames=renames, batches=batches, batch_size=batch_size)
