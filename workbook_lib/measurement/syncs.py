"""Counting device-to-host synchronizations.

On a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronizing CUDA call warn,
and the warnings are counted. On a CPU nothing ever waits for a device, so the counter counts
the operations that *would* synchronize on a GPU: ``.item()``, ``.tolist()``, ``nonzero``,
boolean-mask indexing, ``.cpu()``/``.numpy()``, ``masked_select``, ``unique``, and Python
conversions (``bool``/``int``/``float`` of a tensor). A ``TorchFunctionMode`` intercepts them.
"""
from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

_SYNCING = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.numpy: "numpy",
    torch.masked_select: "masked_select",
    torch.Tensor.masked_select: "masked_select",
    torch.unique: "unique",
    torch.Tensor.unique: "unique",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__int__: "int",
    torch.Tensor.__float__: "float",
    torch.Tensor.__index__: "index",
}


def _has_bool_index(idx) -> bool:
    if isinstance(idx, torch.Tensor):
        return idx.dtype == torch.bool
    if isinstance(idx, tuple):
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx)
    return False


class _CountingMode(TorchFunctionMode):
    def __init__(self, counter: Counter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _SYNCING.get(func)
        if name is not None:
            if name != "cpu" or (args and args[0].device.type != "cpu"):
                self.counter[name] += 1
            elif name == "cpu":
                self.counter[name] += 0  # .cpu() of a CPU tensor moves nothing
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1 \
                and _has_bool_index(args[1]):
            self.counter["bool_index"] += 1
        return func(*args, **kwargs)


class SyncCounter:
    """Counts syncs in a region: ``with counter.count(): ...``; ``counter.total``."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.by_kind: Counter = Counter()

    @property
    def total(self) -> int:
        return int(sum(self.by_kind.values()))

    @property
    def method(self) -> str:
        return ("torch.cuda.set_sync_debug_mode('warn') warnings" if self.device.type == "cuda"
                else "operations that would sync on a GPU (TorchFunctionMode)")

    @contextmanager
    def count(self):
        if self.device.type == "cuda":
            prev = torch.cuda.get_sync_debug_mode()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield self
                finally:
                    torch.cuda.set_sync_debug_mode(prev)
            for w in caught:
                if "synchroniz" in str(w.message):
                    self.by_kind["cuda_sync"] += 1
        else:
            with _CountingMode(self.by_kind):
                yield self
