"""How far two computations of the same sums may differ when they add in another order (a
vectorized rewrite, a GPU's atomic scatter sums), and the tools ``python -m workbook_lib
equal`` measures that with: :func:`float32_tolerance`, :data:`FLOAT64_TOLERANCE`,
:class:`rounding_probe` (every module's output rounded at a relative size), :class:`rounding_model`
(every operation's result rounded, a sum's by the magnitude of its terms: the bound of a float32
comparison) and :class:`dtype_guard` (the first operation computed in another floating dtype).

The last two are ``TorchDispatchMode`` s, which see every ATen operation below autograd, the
backward's included. Written here because PyTorch has no maintained tool for either
(``torch.testing`` compares, it does not bound rounding).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..common.host import on_host
from ..common.probes import mark_probe

FLOAT64_TOLERANCE = 1e-9
"""Relative tolerance of a comparison run in float64: seven orders of magnitude above float64's
rounding (eps 2.2e-16), six below a 0.2% difference. The rounding probe at this size covers a
tensor whose terms cancel (docs/own-pipeline.md, "The rule")."""

ROUNDING_MODEL_EPS = 4
"""The :class:`rounding_model` of a float32 comparison rounds at this many float32 eps."""


def float32_tolerance(graph, layers: int, floor: float = 2e-5) -> float:
    """Relative tolerance for a float32 result summed in another order.

    Each layer adds up to ``d`` terms per node (the largest in-degree over the edge types,
    summed); random-order rounding errors grow like ``eps * sqrt(d)`` per sum and add up over
    the layers. ``eps`` is float32's (2^-23), times 32 as a margin for the readout and the
    backward pass. Never below ``floor`` (the CPU tests' tolerance).

    Args:
        graph: a CellGraph (``num_genes``, ``edge_index`` per type).
        layers: message-passing layers.
        floor: the smallest tolerance returned.
    """
    if layers < 0:
        raise ValueError(f"'layers' must be >= 0 (got {layers})")
    eps = torch.finfo(torch.float32).eps
    d = 0
    for ei in graph.edge_index.values():
        if ei.numel():
            d += int(torch.bincount(ei[1], minlength=graph.num_genes).max())
    return max(floor, 32 * eps * max(1, d) ** 0.5 * max(1, layers))


class _Noise:
    """Uniform noise in [-1, 1] from a generator of its own (seeded), so that a probe never
    moves torch's global RNG (dropout draws stay where they were). A pool of 2^20 values per
    device and dtype, read at a moving offset: drawing afresh per operation costs more than
    the operations."""

    POOL = 1 << 20

    def __init__(self, seed: int):
        self.seed, self.pools, self.offset = seed, {}, 0

    def like(self, t: torch.Tensor) -> torch.Tensor:
        key = (t.device, t.dtype)
        pool = self.pools.get(key)
        if pool is None:
            g = torch.Generator().manual_seed(self.seed)
            u = (2 * torch.rand(self.POOL, generator=g, dtype=torch.float64) - 1)
            pool = self.pools[key] = torch.cat([u, u]).to(t.device, t.dtype)
        n = t.numel()
        if n > self.POOL:
            return pool[:self.POOL].repeat(-(-n // self.POOL))[:n].view(t.shape)
        self.offset = (self.offset + 7919) % self.POOL  # a prime stride: no two alike
        return pool[self.offset:self.offset + n].view(t.shape)


def _floating(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.layout == torch.strided
            and t.numel() > 0)


class rounding_probe:
    """Within the block, every floating-point tensor a submodule of ``model`` returns is multiplied
    by ``1 + rel * u`` (``u`` uniform in [-1, 1], from a seeded generator of its own): how far that
    moves a result is how far rounding of size ``rel`` can move it, cancellation included.

    Args:
        model: the module whose submodules' outputs are perturbed.
        rel: the relative size (> 0).
        seed: the noise's seed.
    """

    def __init__(self, model: torch.nn.Module, rel: float, seed: int = 0):
        if not rel > 0:
            raise ValueError(f"'rel' must be > 0 (got {rel})")
        self.model, self.rel, self.handles = model, float(rel), []
        self.noise = _Noise(seed)

    @mark_probe  # a converted encoder passes it by on the modules its plan does not call
    def _hook(self, module, inputs, output):
        if _floating(output):
            return output * (1 + self.rel * self.noise.like(output))
        return None

    def __enter__(self) -> "rounding_probe":
        self.handles = [m.register_forward_hook(self._hook) for m in self.model.modules()]
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


_aten = torch.ops.aten
_SUMS = {getattr(getattr(_aten, op), ov) for op, ov in (
    ("mm", "default"), ("addmm", "default"), ("addmm_", "default"), ("bmm", "default"),
    ("baddbmm", "default"), ("mv", "default"), ("addmv", "default"), ("dot", "default"),
    ("sum", "default"), ("sum", "dim_IntList"), ("mean", "default"), ("mean", "dim"),
    ("index_add", "default"), ("index_add_", "default"), ("scatter_add", "default"),
    ("scatter_add_", "default"), ("scatter_reduce", "two"), ("scatter_reduce_", "two"),
    ("embedding_dense_backward", "default"), ("index_put", "default"),
    ("index_put_", "default"), ("_sparse_mm", "default"), ("_sparse_csr_mm", "default"),
    ("segment_reduce", "default")) if hasattr(getattr(_aten, op, None), ov)}
_MEANS = {_aten.mean.default, _aten.mean.dim}
_ROUNDING_IN_PLACE = {"add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "lerp_"}


class rounding_model(TorchDispatchMode):
    """Within the block, every operation's floating-point result is rounded at relative size ``rel``
    (forward and backward, in-place accumulations included; views left exact): an element-wise
    ``y`` becomes ``y (1 + rel u)``, a sum's ``y + rel u sqrt(n) S``, with ``S`` the same
    operation on the terms' absolute values and ``n`` its terms per element. ``u`` is uniform in
    [-1, 1] from a generator of its own. How far this moves a result bounds what rounding at
    ``rel`` can do to it.

    Args:
        rel: the relative size (> 0), e.g. a few float32 eps.
        seed: the noise's seed.
    """

    def __init__(self, rel: float, seed: int = 0):
        super().__init__()
        if not rel > 0:
            raise ValueError(f"'rel' must be > 0 (got {rel})")
        self.rel, self.noise = float(rel), _Noise(seed)

    def _magnitude(self, func, out, args, kwargs) -> torch.Tensor:
        def absolute(v):
            return v.abs() if isinstance(v, torch.Tensor) and v.is_floating_point() else (
                abs(v) if isinstance(v, float) else v)

        def ones(v):
            return torch.ones_like(v) if _floating(v) else (1.0 if isinstance(v, float) else v)

        # (an in-place form writes into its first argument: a new tensor here, never the caller's)
        mag = func(*[absolute(a) for a in args], **{k: absolute(v) for k, v in kwargs.items()})
        if func in _MEANS:
            n = max(1.0, args[0].numel() / max(1, out.numel()))
            return mag * n ** 0.5
        n = func(*[ones(a) for a in args], **{k: ones(v) for k, v in kwargs.items()})
        return mag * n.clamp(min=1).sqrt()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SUMS:
            mutable = func._schema.is_mutable
            before = (args[0].clone(),) + tuple(args[1:]) if mutable else args
            out = func(*args, **kwargs)
            if _floating(out):
                try:
                    mag = self._magnitude(func, out, before, kwargs)
                except (RuntimeError, TypeError, ValueError, IndexError):
                    mag = out.abs()  # an overload the magnitude cannot be taken of: its result
                if mutable:
                    return out.add_(self.rel * self.noise.like(out) * mag)
                return out + self.rel * self.noise.like(out) * mag
            return out
        out = func(*args, **kwargs)
        if func.is_view:
            return out
        if func._schema.is_mutable:
            if func.overloadpacket.__name__ in _ROUNDING_IN_PLACE and _floating(out):
                out.mul_(1 + self.rel * self.noise.like(out))
            return out
        if _floating(out):
            return out * (1 + self.rel * self.noise.like(out))
        if isinstance(out, (tuple, list)):
            return type(out)(o * (1 + self.rel * self.noise.like(o)) if _floating(o) else o
                             for o in out)
        return out


class dtype_guard(TorchDispatchMode):
    """Within the block, records the first operation (forward or backward) whose floating-point
    result is not of ``dtype``: ``found`` is ``"aten.mm returned torch.float32"`` or ``""``.
    Not inside :func:`~workbook_lib.common.host.host_side`: a host plan made by design, whose
    constants are made in a dtype of their own and cast at their use (a user trial: the
    converted form's +-1 push values, exact in float32, sent every converted pipeline's
    ``equal`` to float32).

    Args:
        dtype: the floating dtype every result must have (e.g. ``torch.float64``).
    """

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype, self.found = dtype, ""

    def _check(self, func, t) -> None:
        if (not self.found and isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.dtype != self.dtype):
            self.found = f"{func.overloadpacket} returned {t.dtype}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if on_host():
            return out
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            self._check(func, t)
        return out
