"""Does a rewrite compute the same thing as the pipeline it replaces? (``python -m workbook_lib
equal SLOW FAST``; notebook 06 runs the same check before it trains.)

A user who rewrites a slow pipeline (e.g. with :mod:`workbook_lib.nodemask`, or by vectorizing a
per-sample loop) must know the rewrite computes the same model before its speed means anything.
The check:

1. builds both pipelines from the same seed (``params["seed"]``, set before each factory call);
2. maps the slow model's parameters to the fast model's by name (an explicit ``OLD=NEW`` rename
   per parameter or module prefix where the rewrite names them differently) and refuses, naming
   both sides, when a parameter is missing, extra or of another shape
   (:class:`ParameterMismatchError`, a bad input: exit 2);
3. copies the slow model's parameters (and its same-named, same-shaped buffers) into the fast one,
   so the two start from the very same numbers whatever their initialisation;
4. switches off every dropout module of both models (``torch.nn`` ``Dropout``, ``Dropout1d/2d/3d``,
   ``AlphaDropout``, ``FeatureAlphaDropout``: a vectorized rewrite draws their masks in another
   order, so draw for draw the two cannot agree); every other module stays in training mode
   (batch norm in training mode is a deterministic function of the batch), or, with
   ``mode="eval"``, every module in eval mode;
5. runs the same batch(es) through both, each through its own stages (dataset items ``i*B`` to
   ``(i+1)*B - 1``, collate, transfer, prepare, forward, loss, backward: the seam of
   :mod:`workbook_lib.pipelines.protocol`), **in float64**: both models converted, the batch's and
   the pipeline's floating-point tensors converted, the default dtype float64, torch's RNG set to
   the seed before each forward. Where a pipeline cannot run in float64 (it raises, or an
   operation computes in another dtype: :class:`~workbook_lib.measurement.precision.dtype_guard`),
   the whole check runs in the pipelines' own float32 and says why;
6. runs the slow pipeline again with another seed: randomness left after step 4 (functional
   dropout, ``dropout_edge``, noise) changes its outputs, and the check refuses
   (:class:`StochasticPipelineError`, exit 2) rather than call a different draw a difference.
   Where the two differ, the fast pipeline is run again the same way;
7. compares the outputs, the loss and every mapped parameter's gradient.

Afterwards both models are as they were after step 3: their dtype, parameters, buffers (batch
norm's running statistics included) and modes restored, their gradients cleared.

The rule, per tensor (the outputs, the loss, each parameter's gradient): the rewrite's tensor is
*equal* when ``max|fast - slow| <= allowed``, with

    allowed = max(tol * max(max|slow|, max|fast|),  max|probe - slow|)

``probe`` is the slow pipeline run again with rounding injected, and ``max|probe - slow|`` how
far that moves the tensor: a tensor's own size is no scale for its rounding when it is a small
difference of large terms (a GIN ``eps`` gradient summed over every node of the perturbed graphs
minus the same over the wildtype graph; the Lazy model's last bias gradient, exactly 0 in exact
arithmetic). The probe moves it as much as rounding of its terms does.

* In float64: ``tol`` is :data:`~workbook_lib.measurement.precision.FLOAT64_TOLERANCE` (1e-9)
  and the probe is :class:`~workbook_lib.measurement.precision.rounding_probe` at that size
  (every module's output rounded at relative size 1e-9). float64 rounding (2.2e-16) magnified
  by any cancellation measured stays orders of magnitude below, a 0.2% difference orders of
  magnitude above.
* In float32 (the fallback): ``tol`` is the float32 bound of
  :func:`~workbook_lib.measurement.precision.float32_tolerance` and the probe is
  :class:`~workbook_lib.measurement.precision.rounding_model` at 4 float32 eps: every
  operation's result rounded, a sum's by ``sqrt(terms) x sum |term|``, the magnitude of what
  was summed into it, not of its result.

Shapes that differ (other than ``[B]`` against ``[B, 1]``), a gradient on one side only, or a
non-finite value on either side are *different*; both sides without a gradient are equal.
Differences are taken in float64.

Written here rather than with ``torch.testing.assert_close``: that raises on the first tensor
with an element-wise ``atol + rtol * |expected|`` rule, where this must report every tensor of the
pair in one table, against a tolerance that follows the rounding of each tensor's own terms.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...exceptions import WorkbookError
from ...results.adoption import EqualityResult, TensorDiff


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


class StochasticPipelineError(WorkbookError, ValueError):
    """A pipeline's outputs change from one run to the next on the same batch with its dropout
    modules switched off (randomness the check cannot switch off: functional dropout,
    ``dropout_edge``, noise, an unseeded generator), so a difference between the two pipelines
    cannot be told from a different draw (a bad input: exit 2).

    Attributes:
        side: ``slow`` or ``fast``.
        pipeline: its name.
        row: the tensor that changed most, compared between the two runs.
    """

    def __init__(self, message: str, *, side: str, pipeline: str, row: "TensorDiff"):
        super().__init__(message)
        self.side, self.pipeline, self.row = side, pipeline, row


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


# ------------------------------------------------------------------ running one side
def dropout_modules(model: torch.nn.Module) -> dict[str, float]:
    """``{module name: p}`` of every dropout module of ``model`` (``torch.nn`` ``Dropout``,
    ``Dropout1d/2d/3d``, ``AlphaDropout``, ``FeatureAlphaDropout``: the subclasses of
    ``torch.nn.modules.dropout._DropoutNd``)."""
    from torch.nn.modules.dropout import _DropoutNd

    return {n or type(model).__name__: float(m.p) for n, m in model.named_modules()
            if isinstance(m, _DropoutNd)}


class _ModelState:
    """A model's parameters (their tensors), buffers (their tensors and values), modes and every
    module's other attributes (a cache a forward fills, e.g. ``GCNConv(cached=True)``'s, filled
    in float64 during a run, is dropped), put back by :meth:`restore` after a run changed its
    dtype, batch norm's running statistics or its modes."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.attrs = [(m, dict(m.__dict__)) for m in model.modules()]
        self.params = [(p, p.data) for p in model.parameters()]
        self.buffers = [(m, n, b, b.detach().clone()) for m in model.modules()
                        for n, b in m._buffers.items() if b is not None]
        self.modes = [(m, m.training) for m in model.modules()]

    def restore(self) -> None:
        for m, attrs in self.attrs:
            m.__dict__.clear()
            m.__dict__.update(attrs)
        with torch.no_grad():
            for p, data in self.params:
                p.data = data
            for m, n, b, saved in self.buffers:
                b.copy_(saved)
                m._buffers[n] = b
        for m, training in self.modes:
            m.training = training
        self.model.zero_grad(set_to_none=True)


def _to_float64(obj: Any, memo: dict, depth: int = 0) -> Any:
    """``obj`` with its floating-point tensors in float64: a converted copy where anything
    changed (tensors, dicts, lists, tuples, PyG ``Data``/``HeteroData``/``Batch``, and the
    attributes of plain objects down to 3 levels), the original untouched; ``obj`` itself
    otherwise. Modules are left alone (the models are converted apart)."""
    import copy
    import types

    if isinstance(obj, torch.Tensor):
        return obj.to(torch.float64) if obj.is_floating_point() and \
            obj.dtype != torch.float64 else obj
    if isinstance(obj, (torch.nn.Module, str, bytes, int, float, bool, type(None), type,
                        types.ModuleType, types.FunctionType, types.MethodType,
                        torch.device, torch.dtype)):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    memo[key] = obj  # a cycle comes back as the original
    out = obj
    if isinstance(obj, dict):
        new = {k: _to_float64(v, memo, depth) for k, v in obj.items()}
        if any(new[k] is not obj[k] for k in obj):
            out = type(obj)(new) if type(obj) is not dict else new
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        new = [_to_float64(v, memo, depth) for v in obj]
        if any(n is not o for n, o in zip(new, obj)):
            out = type(obj)(*new)
    elif isinstance(obj, (list, tuple)):
        new = [_to_float64(v, memo, depth) for v in obj]
        if any(n is not o for n, o in zip(new, obj)):
            out = type(obj)(new)
    elif hasattr(obj, "stores") and callable(getattr(obj, "apply", None)):  # PyG data
        try:
            out = copy.copy(obj).apply(
                lambda t: t.to(torch.float64) if t.is_floating_point() else t)
        except Exception:  # noqa: BLE001 - left as it is; the dtype guard sees its use
            out = obj
    elif depth < 3 and hasattr(obj, "__dict__"):
        changed = {}
        for k, v in vars(obj).items():
            n = _to_float64(v, memo, depth + 1)
            if n is not v:
                changed[k] = n
        if changed:
            try:
                out = copy.copy(obj)
                out.__dict__.update(changed)
            except Exception:  # noqa: BLE001 - an object that cannot be copied stays as it is
                out = obj
    memo[key] = out
    return out


@contextlib.contextmanager
def _precision(pipe, dtype: torch.dtype):
    """Within the block, ``pipe`` runs in ``dtype``: for float64 its model converted, its own
    floating-point attributes replaced by float64 copies and the default dtype float64; all
    put back on exit (the model by the caller's :class:`_ModelState`)."""
    if dtype != torch.float64:
        yield
        return
    swapped, memo = {}, {}
    default = torch.get_default_dtype()
    try:
        pipe.model.to(torch.float64)
        for k, v in list(vars(pipe).items()):
            if k != "model":
                new = _to_float64(v, memo)
                if new is not v:
                    swapped[k] = v
                    setattr(pipe, k, new)
        torch.set_default_dtype(torch.float64)
        yield
    finally:
        torch.set_default_dtype(default)
        for k, v in swapped.items():
            setattr(pipe, k, v)


@dataclass
class _Run:
    out: Any
    loss: torch.Tensor
    grads: dict
    off_dtype: str = ""  # the dtype guard's finding


def _seed_all(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def _run(pipe, state: _ModelState, batch_index: int, batch_size: int, seed: int, *,
         dtype: torch.dtype, mode: str = "train", probe=None, guard: bool = False) -> _Run:
    """One batch through every stage of ``pipe`` in ``dtype``, dropout modules off (every module
    in eval mode with ``mode="eval"``); ``probe``: a context factory ``model -> context``
    around the forward, loss and backward; ``guard``: record an operation in another dtype.
    The model is restored afterwards (``state``)."""
    from torch.nn.modules.dropout import _DropoutNd

    from ...measurement.precision import dtype_guard

    try:
        with _precision(pipe, dtype):
            ds = pipe.dataset()
            lo = batch_index * batch_size
            items = [ds[i] for i in range(lo, lo + batch_size)]
            batch = pipe.to_device(pipe.collate(items), False)
            if dtype == torch.float64:
                batch = _to_float64(batch, {})
            inputs = pipe.prepare(batch)
            if dtype == torch.float64:
                inputs = _to_float64(inputs, {})
            model = pipe.model
            model.train(mode == "train")
            for m in model.modules():
                if isinstance(m, _DropoutNd):
                    m.eval()
            model.zero_grad(set_to_none=True)
            _seed_all(seed)  # the same draws for both, where anything still draws
            g = dtype_guard(dtype) if guard else contextlib.nullcontext()
            with g, (probe(model) if probe else contextlib.nullcontext()):
                out = pipe.forward(model, inputs)
                loss = pipe.loss(out, batch)
                loss.backward()
            grads = {n: (None if p.grad is None else p.grad.detach().clone())
                     for n, p in model.named_parameters()}
            return _Run(_detach(out), loss.detach(), grads, g.found if guard else "")
    finally:
        state.restore()


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_detach(v) for v in x]
    return x


# ------------------------------------------------------------------ the check
def _compare(a: _Run, b: _Run, mapping: dict[str, str] | None, tolerance: float,
             probe: _Run | None = None) -> list[TensorDiff]:
    """Rows of ``b`` against ``a``: the outputs and the loss, and with ``mapping`` every
    gradient (``probe``: the rule's probe run of ``a``'s side)."""
    rows = []
    la, lb = _leaves(a.out, "output"), _leaves(b.out, "output")
    lp = _leaves(probe.out, "output") if probe else None
    if la is None or lb is None or set(la) != set(lb):
        rows.append(TensorDiff("output", "output", math.nan, math.nan, math.inf, math.nan,
                               math.nan, math.inf, False, f"outputs of another structure "
                               f"({_structure(la)} and {_structure(lb)})"))
    else:
        rows += [compare_tensors(k, "output", la[k], lb[k], tolerance, probe=(lp or {}).get(k))
                 for k in la]
    rows.append(compare_tensors("loss", "loss", a.loss, b.loss, tolerance,
                                probe=probe.loss if probe else None))
    for n, m in (mapping or {}).items():
        rows.append(compare_tensors(n, "gradient", a.grads[n], b.grads[m], tolerance,
                                    probe=probe.grads[n] if probe else None,
                                    fast_name=m if m != n else ""))
    return rows


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}{'...' if len(text) > 160 else ''}"


def _refuse_stochastic(pipe, side: str, seed: int, rows: list[TensorDiff], mode: str) -> None:
    """Raise :class:`StochasticPipelineError` when a row of the two seeds' runs differs."""
    bad = [r for r in rows if not r.equal]
    if not bad:
        return
    w = max(bad, key=lambda r: r.ratio)
    how = "in eval mode" if mode == "eval" else "with dropout modules off"
    raise StochasticPipelineError(
        f"'{pipe.name}' ({side}) is still random {how}: seeds {seed} and {seed + 1} give "
        f"another {w.name} ({w.rel_diff:.1e} of its size), so a difference could be a draw. "
        "Make it follow the module's training flag (F.dropout, dropout_edge: "
        "training=self.training) and pass --eval",
        side=side, pipeline=pipe.name, row=w)


def _try_float64(run, pipes: dict, seed: int) -> tuple[torch.dtype, dict, str]:
    """Batch 0 of both sides in float64 under the dtype guard: ``(float64, {side: run}, "")``
    where both ran in it, else ``(float32, {}, why)``."""
    first = {}
    for side in ("slow", "fast"):
        name = pipes[side].name
        try:
            r = run(side, 0, seed, torch.float64, guard=True)
        except Exception as exc:  # noqa: BLE001 - any failure: float32, and said why
            return torch.float32, {}, f"float64 could not run: '{name}' raised {_one_line(exc)}"
        if r.off_dtype:
            return torch.float32, {}, (f"float64 could not run: '{name}' computes in another "
                                       f"dtype ({r.off_dtype})")
        first[side] = r
    return torch.float64, first, ""


def _rule(dtype: torch.dtype, tolerance: float, tolerance_basis: str,
          tolerance64: float | None, seed: int):
    """``(tol, its basis, the probe in words, probe factory model -> context)`` of the rule in
    ``dtype`` (module docstring)."""
    from ...measurement.precision import (FLOAT64_TOLERANCE, ROUNDING_MODEL_EPS, rounding_model,
                                          rounding_probe)

    if dtype == torch.float64:
        tol = FLOAT64_TOLERANCE if tolerance64 is None else tolerance64
        basis = ("float64: seven orders of magnitude above its rounding, six below a 0.2% "
                 "difference" if tolerance64 is None else "given") + f" ({tol:.0e})"
        return (tol, basis, f"every module's output rounded at relative size {tol:.0e}",
                lambda model: rounding_probe(model, tol, seed=seed))
    rel = ROUNDING_MODEL_EPS * torch.finfo(torch.float32).eps
    return (tolerance, tolerance_basis,
            f"every operation's result rounded at {ROUNDING_MODEL_EPS} float32 eps ({rel:.1e}), "
            "a sum's by sqrt(terms) x the sum of its terms' magnitudes",
            lambda model: rounding_model(rel, seed=seed))


def check_pipelines(slow, fast, *, tolerance: float, tolerance_basis: str, seed: int = 0,
                    renames: dict[str, str] | None = None, batches: int = 1,
                    batch_size: int | None = None, precision: str = "float64",
                    mode: str = "train", tolerance64: float | None = None) -> EqualityResult:
    """Steps 2-7 of the module docstring on two built pipelines (the fast model's parameters are
    overwritten with the slow model's; both models are otherwise as before, gradients cleared).

    Args:
        slow: the reference pipeline.
        fast: the rewrite.
        tolerance: the rule's relative tolerance in float32.
        tolerance_basis: how it was derived (for the report).
        seed: the RNG seed set before each forward (the runs that look for randomness use
            ``seed + 1``).
        renames: slow name (or prefix) -> fast name, see :func:`parameter_mapping`.
        batches: how many batches to compare (the first ones of each dataset).
        batch_size: samples per batch (default: the slow pipeline's).
        precision: ``float64`` (falls back to float32 where a pipeline cannot run in it, and
            says why) or ``float32`` (the pipelines' own).
        mode: ``train`` (every module in training mode but dropout) or ``eval``.
        tolerance64: the rule's relative tolerance in float64 (default
            :data:`~workbook_lib.measurement.precision.FLOAT64_TOLERANCE`).

    Raises:
        ParameterMismatchError: the parameters do not pair.
        StochasticPipelineError: a pipeline's outputs change with the seed.
        ValueError: ``batches``, ``batch_size``, ``precision`` or ``mode`` invalid, or a dataset
            too small.
    """
    b = batch_size or slow.batch_size
    if not isinstance(batches, int) or batches <= 0:
        raise ValueError(f"'batches' must be a positive integer (got {batches!r})")
    if not isinstance(b, int) or b <= 0:
        raise ValueError(f"'batch_size' must be a positive integer (got {b!r})")
    if precision not in ("float64", "float32"):
        raise ValueError(f"'precision' must be 'float64' or 'float32' (got {precision!r})")
    if mode not in ("train", "eval"):
        raise ValueError(f"'mode' must be 'train' or 'eval' (got {mode!r})")
    if not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
    if tolerance64 is not None and not tolerance64 > 0:
        raise ValueError(f"'tolerance64' must be > 0 (got {tolerance64})")
    for p in (slow, fast):
        n = len(p.dataset())
        if n < batches * b:
            raise ValueError(f"the dataset of '{p.name}' holds {n} items, fewer than {batches} "
                             f"batch(es) of {b}")
    mapping = parameter_mapping(slow.model, fast.model, renames, slow_label=slow.name,
                                fast_label=fast.name)
    copied, not_copied = copy_parameters(slow.model, fast.model, mapping)
    states = {"slow": _ModelState(slow.model), "fast": _ModelState(fast.model)}
    pipes = {"slow": slow, "fast": fast}
    dropout_off = {side: dropout_modules(p.model) for side, p in pipes.items()}

    def run(side: str, i: int, s: int, dtype: torch.dtype, **kw) -> _Run:
        return _run(pipes[side], states[side], i, b, s, dtype=dtype, mode=mode, **kw)

    dtype, first, note = torch.float32, {}, ""
    if precision == "float64":
        dtype, first, note = _try_float64(run, pipes, seed)
    tol, basis, probe_text, probe = _rule(dtype, tolerance, tolerance_basis, tolerance64, seed)
    worst: dict[str, TensorDiff] = {}

    def keep(row: TensorDiff) -> None:
        old = worst.get(row.name)
        if old is None or (not row.equal and old.equal) or (
                row.equal == old.equal and row.ratio > old.ratio):
            worst[row.name] = row

    fast_checked = False
    for i in range(batches):
        a = first.get("slow") if i == 0 else None
        a = a or run("slow", i, seed, dtype)
        if i == 0:  # randomness left with dropout off: the same batch, another seed
            again = run("slow", 0, seed + 1, dtype)
            _refuse_stochastic(slow, "slow", seed, _compare(a, again, None, tol), mode)
        pr = run("slow", i, seed, dtype, probe=probe)
        f = (first.get("fast") if i == 0 else None) or run("fast", i, seed, dtype)
        rows = _compare(a, f, mapping, tol, probe=pr)
        if not fast_checked and not all(r.equal for r in rows):
            fast_checked = True
            again = run("fast", i, seed + 1, dtype)
            _refuse_stochastic(fast, "fast", seed, _compare(f, again, None, tol), mode)
        for row in rows:
            keep(row)
    randomness = (f"none left: the slow pipeline's outputs and loss are the same with seeds "
                  f"{seed} and {seed + 1}" + (", and the fast pipeline's" if fast_checked
                                              else ""))
    return EqualityResult(slow=slow.name, fast=fast.name, tolerance=tol,
                          tolerance_basis=basis, batch_size=b, batches=batches,
                          renames=dict(renames or {}), rows=list(worst.values()),
                          buffers_copied=copied, buffers_not_copied=not_copied,
                          device=str(torch.device(fast.device)),
                          precision="float64" if dtype == torch.float64 else "float32",
                          precision_note=note, probe=probe_text, mode=mode,
                          dropout_off=dropout_off, randomness=randomness)


def _structure(leaves: dict | None) -> str:
    return "no tensor" if leaves is None else ", ".join(leaves)


def equality_tolerance(graph, layers: int) -> tuple[float, str]:
    """The rule's tolerance for ``graph`` and ``layers`` and its basis in words."""
    from ...measurement.precision import float32_tolerance

    tol = float32_tolerance(graph, layers)
    return tol, (f"float32 sums in another order: 32 x eps x sqrt(largest in-degree) x "
                 f"{layers} layers, at least 2e-5 ({tol:.1e})")


def seeded_build(params: dict, name: str, graph, device, **kw):
    """:func:`workbook_lib.pipelines.build_pipeline` with torch's (and Python's and numpy's)
    RNG set to ``params["seed"]`` first, so that two pipelines start from the same draws."""
    import random

    import numpy as np

    from ...pipelines import build_pipeline

    random.seed(params["seed"])
    np.random.seed(params["seed"] % 2 ** 32)
    torch.manual_seed(params["seed"])
    return build_pipeline(params, name, graph, device, **kw)


def check_equal(params: dict, slow: str, fast: str, graph, device, *,
                renames: dict[str, str] | None = None, batches: int = 1,
                batch_size: int | None = None, tolerance: float | None = None,
                precision: str = "float64", mode: str = "train") -> EqualityResult:
    """Build ``slow`` and ``fast`` (built-in strategy names or entries of
    ``params["pipelines"]``) from the same seed and compare them (:func:`check_pipelines`).

    Args:
        params: validated params (``seed``, ``layers`` and the pipelines' own keys).
        slow, fast: the pipelines' names.
        graph: the loaded snapshot.
        device: where both run.
        renames, batches, batch_size, precision, mode: see :func:`check_pipelines`.
        tolerance: the rule's relative tolerance, in whichever precision the check runs
            (default: :data:`~workbook_lib.measurement.precision.FLOAT64_TOLERANCE` in float64,
            :func:`equality_tolerance` in float32).
    """
    if slow == fast:
        raise ValueError(f"compare two different pipelines (got {slow!r} twice)")
    if tolerance is not None and not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
    s = seeded_build(params, slow, graph, device)
    f = seeded_build(params, fast, graph, device)
    if tolerance is None:
        tol, basis = equality_tolerance(graph, params["layers"])
    else:
        tol, basis = tolerance, f"given ({tolerance:.1e})"
    return check_pipelines(s, f, tolerance=tol, tolerance_basis=basis, seed=params["seed"],
                           renames=renames, batches=batches, batch_size=batch_size,
                           precision=precision, mode=mode, tolerance64=tolerance)
