"""One writer per notebook of a run folder: a second run into a folder in use is refused,
naming the run that holds it.

A run takes an exclusive ``flock`` on ``<run>/.lock-<notebook>`` for every notebook it will run,
all before any work, and writes who holds it (host, pid, user, since when, command, SLURM job).
Per notebook rather than per folder, so the jobs of one SLURM submission share their run folder
while two runs of one notebook (whose ranks' pid files would collide) are kept apart.
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..common.locks import locked
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


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def _clear(fh) -> None:
    try:
        fh.truncate(0)
    except OSError:
        pass


@contextmanager
def hold(out: Path, notebooks: list[str]):
    """Hold the run folder ``out`` for ``notebooks`` (see the module docstring).

    Raises:
        RunFolderInUseError: one of them is held by another run (nothing is held then).
    """
    with ExitStack() as held:
        for name in notebooks:
            try:
                fh = held.enter_context(locked(lock_path(out, name), blocking=False))
            except BlockingIOError:
                holder = _read_holder(lock_path(out, name))
                raise RunFolderInUseError(
                    f"run folder {out} is in use: {name} is being run by "
                    f"{describe_holder(holder)}; wait for it, stop it, or use another --out",
                    notebook=name, holder=holder) from None
            held.callback(_clear, fh)  # before the lock is released
            fh.truncate(0)
            fh.write(json.dumps(_me()))
            fh.flush()
        yield
