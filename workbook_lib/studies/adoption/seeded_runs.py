"""One seeded run of a pipeline (outputs, loss and gradients, in float64 or its own precision)
and two runs compared tensor by tensor (see :mod:`.equality`)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from ...results.adoption import TensorDiff


# ------------------------------------------------------------------ comparing tensors
def compare_tensors(name: str, kind: str, slow: torch.Tensor | None, fast: torch.Tensor | None,
                    tolerance: float, *, probe: torch.Tensor | None = None,
                    fast_name: str = "") -> TensorDiff:
    """One row of the table: ``fast`` against ``slow`` under :mod:`.equality`'s rule.

    Args:
        name, kind: the row's name and ``output``, ``loss`` or ``gradient``.
        slow, fast: the two tensors (None: no gradient on that side).
        tolerance: relative tolerance (> 0).
        probe: the slow side under the rounding probe (None: ``tol * scale`` alone).
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


# ------------------------------------------------------------------ comparing two runs
def _structure(leaves: dict | None) -> str:
    return "no tensor" if leaves is None else ", ".join(leaves)


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
