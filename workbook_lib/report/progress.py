"""Progress for long work: on the terminal, never in a report.

Inside a notebook kernel, ipykernel replaces file descriptor 2 with a pipe whose content lands in
the notebook (and so in its HTML), and keeps a copy of the real stderr, which
``sys.stderr.fileno()`` returns. Progress bars write to that copy: papermill and the CLI leave it
on the terminal. :func:`native_stderr_to_terminal` points descriptor 2 at it for a while, for
libraries that write from C++ (the profiler's ``USDT:`` lines). ``WORKBOOK_PROGRESS=0`` turns
progress off (the test suite does); ``WORKBOOK_PROGRESS=notes`` keeps the one-line stage notes and
drops the bars (``--quiet``, SLURM logs). Bars are also dropped where the terminal is not a TTY.
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


def _setting() -> str:
    return os.environ.get("WORKBOOK_PROGRESS", "1").strip().lower()


def enabled() -> bool:
    """Whether anything (stage notes at least) goes to the terminal."""
    return _setting() not in ("0", "false", "no")


def bars_enabled() -> bool:
    return enabled() and _setting() != "notes"


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
    # disable=None: tqdm's own rule, no bar where the stream is not a TTY (a log file)
    disable = True if not bars_enabled() or stream is None else None
    return tqdm(iterable, desc=desc, total=total, leave=leave, file=stream,
                disable=disable, dynamic_ncols=True, mininterval=1.0)


def note(message: str) -> None:
    """A status line on the terminal (never in the report)."""
    stream = _stream()
    if enabled() and stream is not None:
        print(message, file=stream, flush=True)


@contextmanager
def native_stderr_to_terminal() -> Iterator[None]:
    """Send what native code writes to descriptor 2 to the terminal, not into the notebook
    (nowhere when progress is quiet or off)."""
    fd = terminal_fd()
    if bars_enabled() and (fd is None or fd == 2):
        yield
        return
    devnull = None
    if not bars_enabled() or fd is None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        fd = devnull
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        if devnull is not None:
            os.close(devnull)
