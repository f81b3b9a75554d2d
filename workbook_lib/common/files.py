"""Atomic writes: a temporary file with a unique name in the target's folder, then a rename, so
that a reader or a resumed run never sees half a file.

The temporary file gets the mode a plain ``open`` would give (0666 less the umask):
``tempfile.mkstemp`` creates it 0600, which would make a group's shared run folder or snapshot
cache unreadable by the group.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process umask, read from ``/proc`` where it can be (``os.umask`` can only be read by
    setting it, which is not thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def temp_file_beside(path: Path) -> tuple[int, str]:
    """A uniquely named temporary file in ``path``'s folder, with the mode ``open`` would give
    it (0666 less the umask), for an atomic write of ``path``: ``(fd, name)``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except OSError:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named temporary file and a rename (the
    file gets the umask's mode, as ``open`` would give it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


RUN_TEMP = "tmp"  # the run folder's temporary files (of its processes and what they start)
SYSTEM_TEMP_ENV = "WORKBOOK_SYSTEM_TMPDIR"  # the temporary folder before the run's: for locks


def system_temp() -> Path:
    """The machine's temporary folder (the one before a run sent its files to its own): where
    locks that every run and user share live."""
    return Path(os.environ.get(SYSTEM_TEMP_ENV) or tempfile.gettempdir())


SOCKET_ROOM = 70  # longest temp folder whose fork-server socket path fits AF_UNIX's 107 bytes


def restore_temp(tmpdir: str | None) -> None:
    """Set ``TMPDIR`` back to ``tmpdir`` (unset when None) and make ``tempfile`` read it again."""
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None


def pin_multiprocessing_temp() -> None:
    """Make multiprocessing choose its temp folder (its sockets, e.g. the fork server's; removed
    by it at exit) now, in a folder short enough for a socket path: it keeps its first choice for
    the life of the process, and one inside a run's or the preflight's folder (removed at their
    end, or deeper than AF_UNIX allows) would break every later fork server of the process."""
    from multiprocessing import util

    old = tempfile.tempdir
    if len(tempfile.gettempdir()) > SOCKET_ROOM:
        short = str(system_temp())
        tempfile.tempdir = short if len(short) <= SOCKET_ROOM else "/tmp"
    try:
        util.get_temp_dir()
    finally:
        tempfile.tempdir = old


def use_run_temp(run_dir: str | Path, who: str) -> Path:
    """Send this process's temporary files, and those of the processes it starts, to
    ``<run_dir>/tmp/<who>-<pid>`` (``TMPDIR``; PyG writes a module file per ``MessagePassing``
    class there). A process whose ``TMPDIR`` is in the run folder already keeps it. Returns the
    folder."""
    base = (Path(run_dir) / RUN_TEMP).resolve()
    now = Path(os.environ.get("TMPDIR") or tempfile.gettempdir()).resolve()
    if now.is_relative_to(base) and now.is_dir():
        return now
    os.environ.setdefault(SYSTEM_TEMP_ENV, str(now))
    pin_multiprocessing_temp()
    d = base / f"{who}-{os.getpid()}"
    d.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(d)
    tempfile.tempdir = None  # read TMPDIR again
    return d


@contextlib.contextmanager
def temp_for_a_while(prefix: str = "workbook-"):
    """This process's temporary files, and its children's, in a folder of their own that is
    removed at the end (``TMPDIR`` and ``tempfile`` restored): for work before a run folder
    exists (the pipelines' preflight: PyG writes a module file per ``MessagePassing`` class)."""
    import shutil

    before = os.environ.get("TMPDIR")
    pin_multiprocessing_temp()
    d = tempfile.mkdtemp(prefix=prefix)
    os.environ["TMPDIR"] = d
    tempfile.tempdir = None
    try:
        yield Path(d)
    finally:
        restore_temp(before)
        shutil.rmtree(d, ignore_errors=True)

