"""Reused CPU buffers for a converted encoder's large per-step tensors.

glibc serves an allocation above its mmap threshold (32 MB at most) with fresh pages from the
kernel and hands them back when it is freed, so each step of a converted TorchCell-shaped encoder
at the real spec (B = 28, H = 64, nine edge types) faulted in 0.94 M pages: 2.2 s of kernel time
in a 4.3 s step on this project's 2-core CPU. With freed memory kept (``MALLOC_MMAP_MAX_=0``, a
large ``MALLOC_TRIM_THRESHOLD_``) the faults mostly go, but the heap's layout still changes
between steps: one step in four faulted in 35,000 pages again (0.17 s). PyTorch's CPU allocator
keeps no cache (its CUDA allocator does), and an allocator preloaded into the process (jemalloc,
tcmalloc) or glibc's settings are the user's to choose, not a library's: so the converted
encoder's own autograd functions take their large buffers from a :class:`Workspace`, one slot per
call site, each slot's storage kept and reused at the next step.

A slot's storage is free when nothing but the workspace holds it (PyTorch's count of a storage's
users, which counts every tensor on it: ``torch._C._storage_Use_Count``, PyTorch's own function,
which its CUDA-graph trees use the same way; a build without it gets plain allocations, results
unchanged): a buffer saved for a backward, returned to a caller or viewed by anything stays taken
until those are gone, and a request meanwhile gets a fresh tensor.
So a retained graph, two forwards before one backward, an output the caller keeps, or one sent to
another process (whose storage, moved to shared memory, is never reused) do not share memory with
a later step; a lock makes each check and its hand-out one step, for backwards in two threads.
Buffers are handed out as tensors set on the storage (not views of it), so that autograd treats a
returned buffer as any new tensor.

Only on a CPU: on a GPU, PyTorch's caching allocator already reuses blocks, and :meth:`empty`
is ``torch.empty``. The slots hold at most the largest request each has seen (the step's own
large tensors, once): :meth:`clear` gives them back (``fast.workspace.clear()``).
"""
from __future__ import annotations

import math
import threading

import torch

# Requests smaller than this many bytes are left to the allocator (below glibc's mmap
# threshold's ceiling they are served from the heap once it has grown).
MIN_BYTES = 1 << 20

# Slots per call site: a request finding all of a site's storages taken (a second forward before
# the first's backward, gradient accumulation over micro-batches) adds one, up to this many.
PER_SITE = 4

_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _users(t: torch.Tensor) -> int:
    return _use_count(t.untyped_storage()._cdata)


class Workspace:
    """Per-call-site reusable CPU storages (see the module's docstring).

    Args:
        min_bytes: requests below this size are plain allocations.
    """

    def __init__(self, min_bytes: int = MIN_BYTES):
        self.min_bytes = int(min_bytes)
        self._slots: dict = {}  # key -> list of [storage tensor (1-D), users when only held]
        self._lock = threading.Lock()  # a check and its hand-out are one step (two backwards
        # in two threads would otherwise both find a storage free and both take it)
        self.reused = 0  # requests served from a kept storage (for tests and explain)
        self.made = 0  # storages made

    @property
    def nbytes(self) -> int:
        """Bytes held by the slots."""
        return sum(s[0].numel() * s[0].element_size()
                   for slots in self._slots.values() for s in slots)

    def clear(self) -> None:
        """Drop every slot. Tensors handed out stay valid (they hold their storage), so memory
        goes back as they go: a graph or an output still alive keeps its own until freed."""
        with self._lock:
            self._slots.clear()

    def __getstate__(self):
        """Copies and pickles start empty (a lock does not copy)."""
        return {"min_bytes": self.min_bytes}

    def __setstate__(self, state):
        self.__init__(state["min_bytes"])

    def empty(self, key, shape, like: torch.Tensor) -> torch.Tensor:
        """An uninitialized tensor of ``shape`` with ``like``'s dtype and device, contiguous.

        Args:
            key: the call site (any hashable); each site has its own storages.
            shape: the tensor's shape.
            like: a tensor whose dtype and device the result takes.
        """
        shape = tuple(int(s) for s in shape)
        numel = math.prod(shape)
        nbytes = numel * like.element_size()
        if like.device.type != "cpu" or nbytes < self.min_bytes or _use_count is None:
            return like.new_empty(shape)
        with self._lock:
            slots = self._slots.setdefault((key, like.dtype), [])
            for slot in slots:
                if _users(slot[0]) != slot[1]:  # something besides the workspace holds it
                    continue
                if slot[0].untyped_storage().is_shared():
                    # moved to shared memory (sent to another process, which PyTorch's sender
                    # side holds only weakly): the receiver may still read it; never reused
                    slot[:] = self._make(numel, like)
                elif slot[0].numel() < numel:  # too small: an eighth more (later steps vary)
                    slot[:] = self._make(numel + numel // 8, like)
                else:
                    self.reused += 1
                return self._on(slot[0], shape)
            if len(slots) >= PER_SITE:
                return like.new_empty(shape)
            slots.append(self._make(numel, like))
            return self._on(slots[-1][0], shape)

    def _make(self, numel: int, like: torch.Tensor) -> list:
        self.made += 1
        t = like.new_empty(numel)
        return [t, _users(t)]

    @staticmethod
    def _on(storage: torch.Tensor, shape: tuple) -> torch.Tensor:
        # set_ without strides: contiguous ones, as torch.empty(shape) has
        return storage.new_empty(0).set_(storage.untyped_storage(), 0, shape)


def take(ws: tuple | None, name, shape, like: torch.Tensor) -> torch.Tensor:
    """A buffer for one of a call site's tensors: ``ws`` is ``(workspace, site)`` (the site's
    tensors told apart by ``name``), or None for a plain ``like.new_empty(shape)``."""
    if ws is None:
        return like.new_empty(tuple(shape))
    return ws[0].empty((ws[1], name), shape, like)
