"""One writer per notebook of a run folder: a second run into a folder in use is refused,
naming the run that holds it.

A run takes an exclusive ``flock`` on ``<run>/.lock-<notebook>`` for every notebook it will run,
all at once and before any work (``run`` takes all six; a SLURM job running ``--only 04`` takes
04's), and writes who holds it (host, pid, user, since when, the command, the SLURM job) into
the lock file. The kernel releases the lock when the holder exits, however it exits, so a crashed
run leaves no stale lock behind. Locking per notebook rather than per folder lets the jobs of one
SLURM submission (01, 02 and 03 run side by side) share their run folder while two runs of the
same notebook (two ``run`` commands, two ``submit.sh``) are kept apart: two launches of 04 in one
folder would read each other's rank pid files. ``flock`` works across the nodes of a cluster on
NFS (Linux maps it to POSIX locks there) and on Lustre mounted with ``flock``.
"""
from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..exceptions import WorkbookError


class RunFolderInUseError(WorkbookError):
    """Another run holds a notebook of this run folder.

    Attributes:
        notebook: the notebook held.
        holder: what the holder wrote about itself (may be empty).
    """

    def __init__(self, message: str, *, notebook: str, holder: dict):
        super().__init__(message)
        self.notebook, self.holder = notebook, holder


def lock_path(out: Path, notebook: str) -> Path:
    return out / f".lock-{notebook}"


def describe_holder(holder: dict) -> str:
    """'pid 123 on host n1 (user ann, since 12:00:01 UTC, SLURM job 77): python -m ...'."""
    if not holder:
        return "another process (it wrote nothing about itself)"
    bits = [f"pid {holder.get('pid')} on {holder.get('host')}"]
    extra = [f"user {holder.get('user')}"] if holder.get("user") else []
    if holder.get("since"):
        extra.append(f"since {holder['since']}")
    if holder.get("slurm_job_id"):
        extra.append(f"SLURM job {holder['slurm_job_id']}")
    cmd = str(holder.get("command", ""))[:120]
    return f"{bits[0]} ({', '.join(extra)})" + (f": {cmd}" if cmd else "")


def _me() -> dict:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in some containers
        user = str(os.getuid())
    return {"pid": os.getpid(), "host": socket.gethostname(), "user": user,
            "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "command": " ".join(os.path.basename(a) if i == 0 else a
                                for i, a in enumerate(sys.argv))}


def _read_holder(fh) -> dict:
    try:
        fh.seek(0)
        return json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        return {}


@contextmanager
def hold(out: Path, notebooks: list[str]):
    """Hold the run folder ``out`` for ``notebooks`` (see the module docstring).

    Raises:
        RunFolderInUseError: one of them is held by another run (nothing is held then).
    """
    held = []
    try:
        for name in notebooks:
            fh = open(lock_path(out, name), "a+", encoding="utf-8")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fh)
                fh.close()
                raise RunFolderInUseError(
                    f"run folder {out} is in use: {name} is being run by "
                    f"{describe_holder(holder)}; wait for it, stop it, or use another --out",
                    notebook=name, holder=holder) from None
            held.append(fh)
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(_me()))
            fh.flush()
        yield
    finally:
        for fh in held:
            try:
                fh.seek(0)
                fh.truncate()
                fcntl.flock(fh, fcntl.LOCK_UN)
            except OSError:
                pass
            fh.close()
