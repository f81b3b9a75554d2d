"""Counting device-to-host synchronizations (a GPU's queue drained to give the host a value).

On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` makes PyTorch warn at every synchronizing
call, and the warnings are counted. On CPU the counter reports what a GPU would sync: a
``TorchDispatchMode`` counts the aten operators whose CUDA implementation synchronizes
(``_local_scalar_dense``, ``nonzero``, boolean-mask indexing, ``unique``, ...), a
``TorchFunctionMode`` counts copies to the host (``.cpu()``, ``.numpy()``, ``.tolist()``), and
:meth:`SyncCounter.transfer` counts the host-to-device copies the pipeline's ``to_device`` makes as
``pin_memory`` would make them. Counting at the operator level sees a ``.item()`` inside PyG or C++ code the same way.
The full list of operators: docs/development.md, "measurement/syncs.py".
"""
from __future__ import annotations

import sys
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..common.host import in_cache_blocks, on_host
from ..common.rerun import rerun_quietly

_aten = torch.ops.aten

# aten overload packet -> kind, for operators that synchronize on CUDA whatever their arguments
_ALWAYS: dict = {
    _aten._local_scalar_dense: "item/bool/int/float",
    _aten.nonzero: "nonzero",
    _aten.masked_select: "masked_select",
    _aten._unique: "unique",
    _aten._unique2: "unique",
    _aten.unique_dim: "unique",
    _aten.unique_consecutive: "unique",
    _aten.unique_dim_consecutive: "unique",
    _aten.bincount: "bincount",
    _aten.equal: "equal/allclose",
    _aten.allclose: "equal/allclose",
}

# ``.numpy()`` is not among them: a GPU tensor has none (it raises), so it reads a tensor already
# on the host (``x.cpu().numpy()``: one sync, counted at ``.cpu()``; found by a user trial,
# counted twice). On a CPU run ``.cpu()`` returns ``x`` itself, so a later ``x.tolist()`` (a sync
# on a GPU) cannot be told from a read of the copy (none): a ``.tolist()`` or ``.item()`` of what
# a counted copy returned, on the same line of the same call (``x.cpu().tolist()``), is the copy's
# read and not counted again (_HostCopyCounter.__torch_function__, _site); on another line it is
# counted, a chain split over lines too (``(x.cpu()\n.tolist())``: two)
_HOST_COPIES = {
    torch.Tensor.cpu: "copy to host",
    torch.Tensor.tolist: "copy to host",
}

_TORCH_DIR = str(Path(torch.__file__).parent)  # torch's own frames (a mode's, a wrapper's)

H2D = "host-to-device copy (pageable memory)"
KINDS = tuple(sorted(set(_ALWAYS.values()) | {"boolean-mask indexing", "repeat_interleave",
                                               "copy to host", H2D}))


def batch_tensors(batch) -> int:
    """Tensors in a (nested) batch: what moving it to a GPU copies one by one."""
    if isinstance(batch, torch.Tensor):
        return 1
    if isinstance(batch, dict):
        return sum(batch_tensors(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_tensors(v) for v in batch)
    stores = getattr(batch, "stores", None)  # PyG Data / HeteroData / Batch: each store's tensors
    if stores is not None:
        return sum(batch_tensors(dict(st)) for st in stores)
    return 0


def batch_contents(batch, limit: int = 1_000_000) -> dict:
    """What moving a batch to a device walks: ``tensors`` (count), ``tensor_bytes``, ``objects``
    (other leaves) and ``kinds`` (their most common types, in words); containers and PyG stores
    are walked, at most ``limit`` leaves. On a CPU a transfer stage's time is this walk itself.
    """
    tensors = nbytes = objects = 0
    kinds: Counter = Counter()
    stack = [batch]
    seen = 0
    while stack and seen < limit:
        x = stack.pop()
        seen += 1
        if isinstance(x, torch.Tensor):
            tensors += 1
            nbytes += x.numel() * x.element_size()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif getattr(x, "stores", None) is not None and not isinstance(x, (str, bytes)):
            stack.extend(dict(st) for st in x.stores)
        else:
            objects += 1
            kinds[type(x).__name__] += 1
    words = ", ".join(f"{n:,} {k}" for k, n in kinds.most_common(3))
    return {"tensors": tensors, "tensor_bytes": nbytes, "objects": objects, "kinds": words}


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in (indices or ()) if i is not None)


def sync_kind(func, args, kwargs) -> str | None:
    """The kind of host sync an aten call would cause on CUDA, or None."""
    packet = getattr(func, "overloadpacket", func)
    kind = _ALWAYS.get(packet)
    if kind is not None:
        return kind
    if packet in (_aten.index, _aten.index_put, _aten.index_put_, _aten._index_put_impl_):
        if len(args) > 1 and _bool_index(args[1]):
            return "boolean-mask indexing"
        return None
    if packet is _aten.repeat_interleave:
        repeats = args[1] if len(args) > 1 else (args[0] if args else None)
        if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
            return "repeat_interleave"
    return None


class _DispatchCounter(TorchDispatchMode):
    """Counts every aten operator call (``ops``) and, with ``syncs``, the calls that would
    synchronize on CUDA; neither inside host work marked by :func:`~workbook_lib.common.host.
    host_side` (a plan made on the host: its operators are not the step's device work), and no
    operator count inside a CPU-only blocking of the batch marked by :func:`~workbook_lib.common.
    host.cache_blocks` (one block per batch on a GPU: not a loop over the samples)."""

    def __init__(self, counter: Counter, ops: list[int], syncs: bool = True,
                 quiet: list[bool] | None = None):
        super().__init__()
        self.counter, self.ops, self.syncs = counter, ops, syncs
        self.quiet = quiet if quiet is not None else [False]  # a host copy's own read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if on_host():
            return func(*args, **kwargs)
        if not in_cache_blocks():  # a CPU-only blocking of the batch is not a loop to report
            self.ops[0] += 1
        kind = sync_kind(func, args, kwargs) if self.syncs and not self.quiet[0] else None
        if kind is not None:
            self.counter[kind] += 1
        return func(*args, **kwargs)


def _cpu_target(args, kwargs) -> "str | torch.device | None":
    """The target of a ``.to(...)`` onto the CPU, as written (a string or a ``torch.device``);
    None for any other call."""
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (str, torch.device)):
            target = a
    return target if target is not None and torch.device(target).type == "cpu" else None


class _HostCopyCounter(TorchFunctionMode):
    def __init__(self, counter: Counter, owner: "SyncCounter | None" = None,
                 quiet: list[bool] | None = None):
        super().__init__()
        self.counter, self.owner = counter, owner
        self.quiet = quiet if quiet is not None else [False]  # shared with the dispatch counter
        self._copy: tuple | None = None  # the last counted copy: (result id, frame id, code, line)

    @staticmethod
    def _site() -> tuple:
        """The calling frame's id, code and line, called from ``__torch_function__``: the first
        frame above it that is no mode's handler (a tensor method called from Python has no
        frame of its own; a mode inside this one, ``with torch.device(...)`` say, adds its own
        ``__torch_function__``, whose frame is the same for every call: a review)."""
        f = sys._getframe(2)
        while f.f_back is not None and (f.f_code.co_name == "__torch_function__" or
                                        f.f_code.co_filename.startswith(_TORCH_DIR)):
            f = f.f_back
        return id(f), f.f_code, f.f_lineno

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if on_host():  # host work by design (common/host.py): a GPU run does it on the host too
            return func(*args, **kwargs)
        if func in (torch.Tensor.tolist, torch.Tensor.item) and self._copy is not None and \
                args and (id(args[0]),) + self._site() == self._copy:
            # the read of what the last counted copy returned, on the same line of the same
            # call (``x.cpu().tolist()``): the copy's own (see ``_HOST_COPIES``)
            self.quiet[0] = True  # .item()'s aten read: not counted by the dispatch counter
            try:
                return func(*args, **kwargs)
            finally:
                self.quiet[0] = False
        kind = _HOST_COPIES.get(func)
        target = _cpu_target(args, kwargs) if kind is None and func is torch.Tensor.to else None
        if target is not None:
            if self.owner is not None and self.owner._moving is not None:
                self.owner._moved += 1  # the pipeline's to_device: a move to the run's device
            elif isinstance(target, str):
                # the host named as a string; a torch.device is the run's own on a CPU run
                # (.to(x.device), .to(self.device): device-agnostic code, a move or nothing on
                # a GPU, never a copy to the host; found by a user trial, each counted as a
                # sync). .to(torch.device("cpu")) written out is missed here, not on a GPU
                kind = "copy to host"
        if kind is None:
            return func(*args, **kwargs)
        self.counter[kind] += 1
        out = func(*args, **kwargs)
        self._copy = (id(out),) + self._site() if func is not torch.Tensor.tolist else None
        return out


class SyncCounter:
    """Counts host syncs inside ``with counter.count(): ...``; ``total`` and ``by_kind``;
    inside ``with counter.stage(name): ...`` also ``by_stage`` (which stage made them) and
    ``ops_by_stage`` (every aten operator call, on any device: a Python loop over samples makes
    more of them with every sample).

    On CUDA the count is PyTorch's own (``set_sync_debug_mode``); on CPU it is what a GPU would
    sync (see the module docstring). ``method`` says which, for reports. Warnings inside
    ``count`` are not shown: it counts a re-run of a step whose plain runs showed them
    (:mod:`workbook_lib.common.rerun`).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.by_kind: Counter = Counter()
        self.by_stage: Counter = Counter()
        self.ops_by_stage: Counter = Counter()  # aten operator calls each stage made
        self._ops = [0]
        self.contents: dict = {}  # what the counted step's batch held (batch_contents)
        self._moving: bool | None = None  # inside to_device on a CPU run: pageable or not
        self._moved = 0  # .to(device) calls to_device made
        self._batch_n = 0  # tensors in the batch it was given
        self._every = False  # its to_device moves every tensor (counted from the batch)

    @property
    def total(self) -> int:
        return int(sum(self.by_kind.values()))

    @property
    def method(self) -> str:
        return method_for(self.device)

    def transfer(self, batch, *, pinned: bool, every_tensor: bool = False) -> None:
        """Inside the ``h2d`` stage, before the pipeline's ``to_device``: count its host-to-device
        copies as a GPU would (CPU runs only: on CUDA the copies themselves report their
        syncs), one sync per copy from pageable memory, none pinned; booked when the stage
        ends. ``every_tensor``: its ``to_device`` moves every tensor of the batch (the
        protocol's default ``move_to``, the built-in strategies'), which on a CPU run skip the
        tensors already there: each tensor of the batch. Otherwise the ``.to(device)`` calls
        ``to_device`` makes (not copies to the host, although the run's device is the CPU), or
        each tensor of the batch where it makes none."""
        self.contents = batch_contents(batch)  # what it carries (found unset by a user trial)
        if self.device.type != "cuda":
            self._moving, self._moved, self._batch_n = not pinned, 0, batch_tensors(batch)
            self._every = every_tensor

    def _moved_copies(self) -> None:
        if self._moving:
            n = self._batch_n if self._every else (self._moved or self._batch_n)
            if n:
                self.by_kind[H2D] += n
        self._moving = None

    @contextmanager
    def stage(self, name: str) -> Iterator["SyncCounter"]:
        """Count the syncs of one stage of a step into ``by_stage[name]`` (and ``by_kind``),
        and its aten operator calls into ``ops_by_stage[name]``."""
        before, ops = self.total, self._ops[0]
        try:
            with self.count():
                yield self
        finally:
            self._moved_copies()  # a transfer() inside this stage
            self.by_stage[name] += self.total - before
            self.ops_by_stage[name] += self._ops[0] - ops

    @contextmanager
    def count(self) -> Iterator["SyncCounter"]:
        if self.device.type == "cuda":
            prev = torch.cuda.get_sync_debug_mode()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with _DispatchCounter(self.by_kind, self._ops, syncs=False):
                        yield self
                finally:
                    torch.cuda.set_sync_debug_mode(prev)
            for w in caught:
                if "synchroniz" in str(w.message).lower():
                    self.by_kind["cuda sync (set_sync_debug_mode)"] += 1
        else:
            quiet = [False]
            with rerun_quietly(), _HostCopyCounter(self.by_kind, self, quiet), \
                    _DispatchCounter(self.by_kind, self._ops, quiet=quiet):
                yield self


def method_for(device: torch.device | str) -> str:
    """How syncs are counted on ``device`` (the label reports show)."""
    if torch.device(device).type == "cuda":
        return "measured: torch.cuda.set_sync_debug_mode('warn') warnings"
    return ("what a GPU would sync: aten operators that synchronize on CUDA, counted by a "
            "TorchDispatchMode (host copies by a TorchFunctionMode, and the copies the "
            "pipeline's to_device makes when the batch is not in pinned memory)")
