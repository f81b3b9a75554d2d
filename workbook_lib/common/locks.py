"""``flock`` on a lock file, as a context manager (:func:`locked`), for the run folder's
notebooks, the snapshot cache's builders and the GPU probes. The kernel drops a lock however its
holder exits, so a crash leaves none stale; ``flock`` works across a cluster's nodes on NFS and
on Lustre mounted with ``flock``.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(path: str | Path, exclusive: bool = True, blocking: bool = True, *,
           shared_by_all: bool = False):
    """Hold a ``flock`` on ``path`` (created if missing) while inside; yields the lock file,
    open for reading and appending (a holder may write about itself in it).

    Args:
        exclusive: ``LOCK_EX``, else ``LOCK_SH``.
        blocking: wait for the lock; else raise at once when another holds it.
        shared_by_all: a lock file every user of the machine shares (a GPU's, in a sticky
            ``/tmp``): opened read-only, and created readable by all whatever the umask.

    Raises:
        BlockingIOError: ``blocking=False`` and another holds it (nothing is held then).
    """
    if shared_by_all:
        fh = open(_shared_fd(Path(path)), "r", encoding="utf-8")
    else:  # the umask's mode, as a plain open gives it
        fh = open(path, "a+", encoding="utf-8")
    with fh:
        fcntl.flock(fh, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                    | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield fh
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _shared_fd(path: Path) -> int:
    """A read-only descriptor of ``path``: opened without ``O_CREAT`` when it exists (in a sticky
    ``/tmp`` another user's file cannot be opened for writing, nor with ``O_CREAT`` under
    ``fs.protected_regular``), else created 0644 (``flock`` needs no write access)."""
    while True:
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # another process created it in between: open that one
            os.fchmod(fd, 0o644)  # whatever the umask: the next user must be able to open it
            return fd
