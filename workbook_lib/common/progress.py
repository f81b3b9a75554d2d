"""Progress for long work: on the terminal, never in a report.

In a notebook kernel, file descriptor 2 lands in the notebook, while ``sys.stderr.fileno()`` is
ipykernel's copy of the real stderr: bars write there. :func:`native_stderr_to_terminal` sends
C++ output there too, less the profiler's ``USDT:`` lines. ``WORKBOOK_PROGRESS=0`` turns
progress off, ``=notes`` keeps only the one-line stage notes; no bars where there is no TTY.
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
    """Send what native code writes to descriptor 2 to the terminal, not into the notebook, less
    the profiler's ``USDT:`` probe lines, which say nothing to a reader (nowhere when progress is
    quiet or off). The output is held in a temporary file while the block runs and filtered
    after it, so no thread has to drain a pipe."""
    import tempfile

    target = terminal_fd() if bars_enabled() else None
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if target is not None:
                held.seek(0)
                kept = [ln for ln in held.read().splitlines(keepends=True)
                        if not ln.lstrip().startswith(b"USDT")]
                if kept:
                    try:
                        os.write(target, b"".join(kept))
                    except OSError:
                        pass
