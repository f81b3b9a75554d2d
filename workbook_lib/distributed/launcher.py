"""Launching DDP runs with ``torchrun`` (``python -m torch.distributed.run``).

The launcher picks a free rendezvous port (single node), gives each rank its share of threads,
and watches the ranks through their heartbeat files (see ``worker``): the time a rank last made
progress and the stage it is in. When no rank makes progress for ``timeout_s``, the launch is
stopped and the error names the cause: a rank whose heartbeat went stale (stopped or frozen
process), or the rank that is not waiting in a collective while the others are. A rank that dies
is named from torchrun's own report ("Root Cause" with its exit code), a rank that raises from
its ``rank{R}.error`` traceback; each with its last output.

torchrun runs in its own session (so an interrupt of the notebook does not reach the ranks
half-way) with a parent-death signal: if the process that launched it dies, torchrun is
terminated and stops its ranks (which carry the same signal towards torchrun). Whatever happens,
every process the launcher started is terminated before it returns.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..exceptions import LaunchError
from ..running import processes

WAITING_STAGES = ("collective", "all-reduce", "barrier", "broadcast", "rendezvous", "agreeing")
STALE_S = 10.0  # a heartbeat thread writes every second; this long without one: not running


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Linux: deliver ``sig`` to this process when its parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class LaunchResult:
    world_size: int
    out_dir: Path
    seconds: float
    ranks: dict = field(default_factory=dict)  # rank -> parsed rank{r}.json
    command: list = field(default_factory=list)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


def read_heartbeats(out: Path) -> dict[int, dict]:
    beats = {}
    for f in out.glob("rank*.heartbeat"):
        try:
            beats[int(f.stem.replace("rank", ""))] = json.loads(f.read_text())
        except (ValueError, OSError):
            continue
    return beats


def diagnose_stall(beats: dict[int, dict], now: float | None = None) -> tuple[list[int], str]:
    """The ranks to blame for a launch that stopped progressing, and a sentence saying why.

    A rank whose heartbeat is older than :data:`STALE_S` is not running (stopped, frozen or
    gone): it is the cause. Otherwise the ranks not waiting in a collective are.
    """
    now = time.time() if now is None else now
    stale = sorted(r for r, b in beats.items() if now - b.get("time", 0) > STALE_S)
    if stale:
        why = "; ".join(f"rank {r}: no heartbeat for {now - beats[r]['time']:.0f} s (stopped or "
                        f"frozen) in stage '{beats[r].get('stage')}'" for r in stale)
        return stale, why
    busy = sorted(r for r, b in beats.items()
                  if not any(w in str(b.get("stage", "")) for w in WAITING_STAGES))
    if busy and len(busy) < len(beats):
        why = "; ".join(f"rank {r} stuck in '{beats[r].get('stage')}'" for r in busy)
        waiting = [r for r in beats if r not in busy]
        why += "; waiting for it: " + ", ".join(f"rank {r} in '{beats[r].get('stage')}'"
                                                for r in sorted(waiting))
        return busy, why
    return [], "every rank waits in a collective (" + ", ".join(
        f"rank {r}: '{b.get('stage')}'" for r, b in sorted(beats.items())) + ")"


def torchrun_root_cause(log_text: str) -> tuple[int | None, str | None]:
    """(global rank, exit code text) from torchrun's "Root Cause" report, if any."""
    m = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+[^\n]*)", log_text, re.S)
    if not m:
        return None, None
    return int(m.group(1)), m.group(2).strip()


def launch(module: str, config: dict, *, nproc_per_node: int, out_dir: str | Path,
           nnodes: int = 1, rdzv_endpoint: str | None = None, timeout_s: float = 300.0,
           threads_per_rank: int | None = None, poll_s: float = 0.2) -> LaunchResult:
    """Run ``python -m <module> <config.json>`` on ``nproc_per_node`` ranks with torchrun.

    Each rank must write ``rank{RANK}.json`` into ``config["out_dir"]`` on success; it may write
    ``rank{RANK}.log``, ``rank{RANK}.heartbeat`` and, on failure, ``rank{RANK}.error``.

    Raises:
        LaunchError: a rank failed, died or stopped progressing (named, with its last output),
            or torchrun could not start. No process is left behind.
    """
    if nproc_per_node <= 0:
        raise ValueError(f"'nproc_per_node' must be a positive integer (got {nproc_per_node})")
    if nnodes <= 0:
        raise ValueError(f"'nnodes' must be a positive integer (got {nnodes})")
    if timeout_s <= 0:
        raise ValueError(f"'timeout_s' must be positive (got {timeout_s})")
    world = nproc_per_node * nnodes
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*"):
        f.unlink()
    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps({**config, "out_dir": str(out.resolve()),
                                    "threads": threads_per_rank}, indent=1))
    if nnodes == 1 and rdzv_endpoint is None:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    else:
        if rdzv_endpoint is None:
            raise ValueError("'rdzv_endpoint' (host:port) is required when nnodes > 1")
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", os.environ.get("SLURM_JOB_ID", "workbook")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0", *rdzv,
           "-m", module, str(cfg_path)]
    if nnodes > 1:  # one torchrun agent per allocated node
        if "SLURM_JOB_ID" not in os.environ:
            raise LaunchError(f"nnodes={nnodes} needs a SLURM allocation (srun starts one "
                              "torchrun per node); run inside sbatch/salloc", kind="start",
                              world_size=world)
        cmd = ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cmd]
    env = dict(os.environ)
    if threads_per_rank:
        env["OMP_NUM_THREADS"] = str(threads_per_rank)
    log = out / "torchrun.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=set_parent_death_signal)
    known: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(proc.pid)
        known[proc.pid] = root
        last_progress, last_key = time.time(), None
        while True:
            try:
                for c in root.children(recursive=True):
                    known.setdefault(c.pid, c)
            except psutil.NoSuchProcess:
                pass
            for f in out.glob("rank*.pid"):  # ranks record their pids
                try:
                    pid = int(f.read_text())
                    if pid not in known:
                        known[pid] = psutil.Process(pid)
                except (ValueError, OSError, psutil.NoSuchProcess):
                    pass
            beats = read_heartbeats(out)
            key = (tuple(sorted((r, b.get("stage"), b.get("progress")) for r, b in beats.items())),
                   tuple(p.stat().st_size for p in sorted(out.glob("rank*.log"))),
                   log.stat().st_size if log.exists() else 0)
            if key != last_key:
                last_key, last_progress = key, time.time()
            rc = proc.poll()
            if rc is not None:
                break
            if time.time() - last_progress > timeout_s:
                blame, why = diagnose_stall(beats)
                tails = "\n".join(f"--- rank {r} last output ---\n{_tail(out / f'rank{r}.log')}"
                                  for r in (blame or sorted(beats)))
                raise LaunchError(
                    f"DDP launch (world size {world}) made no progress for {timeout_s:.0f} s: "
                    f"{why}. Stopped.\n{tails}", kind="hung",
                    rank=blame[0] if blame else None, world_size=world,
                    last_output=_tail(out / f"rank{blame[0]}.log") if blame else "")
            time.sleep(poll_s)
        seconds = time.perf_counter() - t0
        errors = sorted(out.glob("rank*.error"), key=lambda p: p.stat().st_mtime_ns)
        if rc != 0 or errors:
            log_text = log.read_text(errors="replace") if log.exists() else ""
            rank, code = torchrun_root_cause(log_text)
            if rank is not None and code and code.lstrip().startswith("-"):
                # killed by a signal: the others' errors (a collective broken) came after it
                raise LaunchError(
                    f"rank {rank} died (exit code {code}; world size {world}), as torchrun "
                    f"reports.\n--- rank {rank} last output ---\n{_tail(out / f'rank{rank}.log')}",
                    kind="failed", rank=rank, world_size=world,
                    last_output=_tail(out / f"rank{rank}.log"))
            if errors:
                first = errors[0]
                rank = int(first.stem.replace("rank", ""))
                others = [e.stem.replace("rank", "") for e in errors[1:]]
                also = f"; ranks {', '.join(others)} failed after it" if others else ""
                raise LaunchError(
                    f"rank {rank} failed (world size {world}, torchrun exit {rc}{also}):\n"
                    f"{_tail(first, 25)}\n--- rank {rank} last output ---\n"
                    f"{_tail(out / f'rank{rank}.log')}", kind="failed", rank=rank,
                    world_size=world, last_output=_tail(out / f"rank{rank}.log"))
            if rank is not None:
                raise LaunchError(
                    f"rank {rank} died (exit code {code}; world size {world}), as torchrun "
                    f"reports.\n--- rank {rank} last output ---\n{_tail(out / f'rank{rank}.log')}",
                    kind="failed", rank=rank, world_size=world,
                    last_output=_tail(out / f"rank{rank}.log"))
            raise LaunchError(f"torchrun exited with {rc} (world size {world}):\n"
                              f"{_tail(log, 30)}", kind="start", world_size=world)
        ranks = {}
        for f in sorted(out.glob("rank*.json")):
            ranks[int(f.stem.replace("rank", ""))] = json.loads(f.read_text())
        missing = set(range(world)) - set(ranks) if nnodes == 1 else set()
        if missing:
            raise LaunchError(f"ranks {sorted(missing)} wrote no results:\n{_tail(log, 30)}",
                              kind="no results", world_size=world)
        return LaunchResult(world_size=world, out_dir=out, seconds=seconds, ranks=ranks,
                            command=cmd)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        processes.terminate(known.values())
