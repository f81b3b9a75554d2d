"""Launching real DDP runs with ``torchrun`` (``python -m torch.distributed.run``).

The launcher picks a free rendezvous port (single node), gives each rank its own log file, and
watches them: a rank that raises ends the run (torchrun stops the others) and the error names
the rank and shows its last output; when every rank is silent for ``timeout_s`` the run is
killed. Whatever happens, every process it started (torchrun and its workers, which run in
their own sessions) is terminated before it returns.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..running import processes
from ..exceptions import LaunchError


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def launch(module: str, config: dict, *, nproc_per_node: int, out_dir: str | Path,
           nnodes: int = 1, rdzv_endpoint: str | None = None, timeout_s: float = 300.0,
           threads_per_rank: int | None = None, poll_s: float = 0.2) -> LaunchResult:
    """Run ``python -m <module> <config.json>`` on ``nproc_per_node`` ranks with torchrun.

    Each rank must write ``rank{RANK}.json`` into ``config["out_dir"]`` on success and may
    write ``rank{RANK}.log`` (progress) and ``rank{RANK}.error`` (traceback).

    Raises:
        LaunchError: a rank failed (named, with its last output), the run went silent for
            ``timeout_s``, or torchrun could not start. No process is left behind.
    """
    if nproc_per_node <= 0:
        raise ValueError(f"'nproc_per_node' must be a positive integer (got {nproc_per_node})")
    if timeout_s <= 0:
        raise ValueError(f"'timeout_s' must be positive (got {timeout_s})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*"):
        f.unlink()
    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps({**config, "out_dir": str(out)}, indent=2))
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
                              "torchrun per node); run inside sbatch/salloc")
        cmd = ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cmd]
    env = dict(os.environ)
    if threads_per_rank:
        env["OMP_NUM_THREADS"] = str(threads_per_rank)
    log = out / "torchrun.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    known: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(proc.pid)
        known[proc.pid] = root
        last_activity = time.time()
        while True:
            try:
                for c in root.children(recursive=True):
                    known.setdefault(c.pid, c)
            except psutil.NoSuchProcess:
                pass
            for f in out.glob("rank*.pid"):  # ranks record their pid (they run in new sessions)
                try:
                    pid = int(f.read_text())
                    if pid not in known:
                        known[pid] = psutil.Process(pid)
                except (ValueError, OSError, psutil.NoSuchProcess):
                    pass
            mtimes = [p.stat().st_mtime for p in [log, *out.glob("rank*.log")] if p.exists()]
            last_activity = max([last_activity, *mtimes])
            rc = proc.poll()
            if rc is not None:
                break
            if time.time() - last_activity > timeout_s:
                silent = sorted(out.glob("rank*.log"), key=lambda p: p.stat().st_mtime)
                who = silent[0].stem if silent else "every rank"
                tails = "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in silent)
                raise LaunchError(
                    f"DDP run (world size {nproc_per_node * nnodes}) silent for {timeout_s:.0f} s "
                    f"(first silent: {who}); killed.\n{tails}\n--- torchrun ---\n{_tail(log)}")
            time.sleep(poll_s)
        seconds = time.perf_counter() - t0
        # the first rank to fail is the cause; the others fail after it, in a collective
        errors = sorted(out.glob("rank*.error"), key=lambda p: p.stat().st_mtime_ns)
        if rc != 0 or errors:
            if errors:
                first = errors[0]
                rank = first.stem.replace("rank", "")
                others = [e.stem.replace("rank", "") for e in errors[1:]]
                also = f"; ranks {', '.join(others)} failed after it" if others else ""
                raise LaunchError(
                    f"rank {rank} failed (world size {nproc_per_node * nnodes}, torchrun exit "
                    f"{rc}{also}):\n{_tail(first, 25)}\n--- rank {rank} last output ---\n"
                    f"{_tail(out / f'rank{rank}.log')}")
            raise LaunchError(f"torchrun exited with {rc} (world size "
                              f"{nproc_per_node * nnodes}):\n{_tail(log, 30)}")
        ranks = {}
        for f in sorted(out.glob("rank*.json")):
            ranks[int(f.stem.replace("rank", ""))] = json.loads(f.read_text())
        missing = set(range(nproc_per_node * nnodes)) - set(ranks) if nnodes == 1 else set()
        if missing:
            raise LaunchError(f"ranks {sorted(missing)} wrote no results:\n{_tail(log, 30)}")
        return LaunchResult(world_size=nproc_per_node * nnodes, out_dir=out, seconds=seconds,
                            ranks=ranks, command=cmd)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        processes.terminate(known.values())
