"""Progress for long work: on the terminal, never in a report.

Inside a notebook kernel, ipykernel replaces file descriptor 2 with a pipe whose content lands in
the notebook (and so in its HTML), and keeps a copy of the real stderr, which
``sys.stderr.fileno()`` returns. Progress bars write to that copy: papermill and the CLI leave it
on the terminal. :func:`native_stderr_to_terminal` points descriptor 2 at it for a while, for
libraries that write from C++ (the profiler's ``USDT:`` lines). ``WORKBOOK_PROGRESS=0`` turns
progress off (the test suite does).
"""
from __future__ import annotations

import io
import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")
_STREAM: list = []


def enabled() -> bool:
    return os.environ.get("WORKBOOK_PROGRESS", "1") not in ("0", "false", "no")


def terminal_fd() -> int | None:
    """The descriptor of the process's real stderr (outside a kernel: 2)."""
    try:
        return sys.stderr.fileno()
    except (OSError, io.UnsupportedOperation, AttributeError, ValueError):
        return None


def _stream():
    if not _STREAM:
        fd = terminal_fd()
        _STREAM.append(os.fdopen(fd, "w", closefd=False) if fd is not None else None)
    return _STREAM[0]


def progress(iterable: Iterable[T] | None = None, *, desc: str = "", total: int | None = None,
             leave: bool = False) -> tqdm:
    """A tqdm bar on the terminal, or a silent one."""
    stream = _stream()
    return tqdm(iterable, desc=desc, total=total, leave=leave, file=stream,
                disable=not enabled() or stream is None, dynamic_ncols=True, mininterval=1.0)


def note(message: str) -> None:
    """A status line on the terminal (never in the report)."""
    stream = _stream()
    if enabled() and stream is not None:
        print(message, file=stream, flush=True)


@contextmanager
def native_stderr_to_terminal() -> Iterator[None]:
    """Send what native code writes to descriptor 2 to the terminal, not into the notebook."""
    fd = terminal_fd()
    if fd is None or fd == 2:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
