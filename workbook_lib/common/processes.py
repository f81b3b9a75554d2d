"""Stopping processes we started, whatever state they are in."""
from __future__ import annotations

from collections.abc import Iterable

import psutil


def is_alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def terminate(procs: Iterable[psutil.Process], grace: float = 5.0) -> list[int]:
    """SIGTERM every live process, wait ``grace`` seconds, SIGKILL the rest; returns the pids
    that were alive."""
    alive = []
    for p in procs:
        if not is_alive(p):
            continue
        try:
            p.terminate()
            alive.append(p)
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=grace)
    for p in still:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(still, timeout=grace)
    return [p.pid for p in alive]
