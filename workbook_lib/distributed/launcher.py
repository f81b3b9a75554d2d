"""Launching DDP runs with ``torchrun`` (``python -m torch.distributed.run``).

The launcher picks a free rendezvous port (single node), gives each rank its share of threads,
and watches the ranks' heartbeat files (see ``worker``): a rank whose heartbeat is stale, or a
launch where no rank progresses for ``timeout_s``, is stopped and the cause named (a rank that
never started, died, raised, or is not waiting in a collective while the others are). Only this
host's ranks are signalled, and every process the launcher started is terminated before it
returns. The timeouts' rules and torchrun's session: docs/development.md.
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

from ..configs.checks import MIN_TIMEOUT_S, MIN_TIMEOUT_WHY
from ..exceptions import LaunchError
from ..records import to_json
from ..common import processes
from ..measurement.cpu import mark_run_root

WAITING_STAGES = ("collective", "all-reduce", "barrier", "broadcast", "rendezvous", "agreeing")
STALE_S = 10.0  # a heartbeat thread writes every second; this long without one: not running
STARTUP_S = 120.0  # the least time ranks get to start (import, rendezvous, build the models)


def pg_timeout_s(timeout_s: float, startup_s: float = STARTUP_S) -> float:
    """The process-group timeout given to the ranks for a launch whose stall timeout is
    ``timeout_s``: longer than everything the launcher waits before it names a cause (the
    start-up allowance, the stall timeout, a stale heartbeat, a few polls), so that the ranks
    waiting for a stopped one never time out first and blame themselves."""
    return max(timeout_s, startup_s, STARTUP_S) + 2 * STALE_S + 30.0


def allowed_silence_s(beats: dict, *, world: int, nnodes: int, started: bool,
                      timeout_s: float, startup_s: float = STARTUP_S) -> float:
    """How long the launch may make no progress before it is stopped, in its present phase.

    Args:
        beats: the ranks' latest heartbeats, by rank (those that wrote one).
        world: the world size.
        nnodes: the node count (on several nodes another node's ranks write no beat here).
        started: whether every rank has reached its training loop.
        timeout_s: the stall limit once every rank is in its training loop.
        startup_s: the caller's start-up allowance.

    While ranks are still importing Python and torch (a single node, not every rank has beaten
    yet): the largest of ``timeout_s``, ``startup_s`` and :data:`STARTUP_S`. Then, until every
    rank is in its training loop, and again once every rank is done: the larger of
    ``timeout_s`` and ``startup_s``. In the training loop: ``timeout_s``.
    """
    if len(beats) < world and nnodes == 1:  # Python and torch still importing
        return max(timeout_s, startup_s, STARTUP_S)
    ending = all(str(b.get("stage", "")).startswith("done") for b in beats.values())
    return timeout_s if started and not ending else max(timeout_s, startup_s)


def read_pid_file(path: Path) -> tuple[int, str] | None:
    """(pid, host) from a rank's pid file, or None when it is unreadable."""
    try:
        doc = json.loads(path.read_text())
        return int(doc["pid"]), str(doc.get("host", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def local_pid(path: Path) -> int | None:
    """The pid of a rank's pid file when that rank runs on this host (ranks on other nodes have
    other hosts' pids: never signalled from here)."""
    got = read_pid_file(path)
    if got is None or got[1] != socket.gethostname():
        return None
    return got[0]


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


def stale_ranks(beats: dict[int, dict], now: float | None = None) -> list[int]:
    """Ranks whose heartbeat is older than :data:`STALE_S` (stopped, frozen or gone)."""
    now = time.time() if now is None else now
    return sorted(r for r, b in beats.items() if now - b.get("time", 0) > STALE_S)


def diagnose_stall(beats: dict[int, dict], now: float | None = None,
                   world: int | None = None) -> tuple[list[int], str]:
    """The ranks to blame for a launch that stopped progressing, and a sentence saying why.

    A rank whose heartbeat is older than :data:`STALE_S` is not running (stopped, frozen or
    gone): it is the cause. Then a rank that never wrote a heartbeat (of ``world`` expected)
    never started. Otherwise the ranks not waiting in a collective are.
    """
    now = time.time() if now is None else now
    stale = stale_ranks(beats, now)
    if not stale and world is not None and len(beats) < world:
        missing = sorted(set(range(world)) - set(beats))
        return missing, ("; ".join(f"rank {r} never started (no heartbeat)" for r in missing)
                         + "; started: " + (", ".join(f"rank {r} in '{b.get('stage')}'"
                                                      for r, b in sorted(beats.items()))
                                            or "none"))
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
    stages = ", ".join(f"rank {r}: '{b.get('stage')}'" for r, b in sorted(beats.items()))
    if busy:  # a step's own all-reduces (DDP's) run inside 'training loop': not told apart
        return [], (f"no rank reported progress ({stages}); within a training step a rank's "
                    "stage does not tell computing from waiting in the step's all-reduce")
    return [], f"every rank waits in a collective ({stages})"


def torchrun_root_cause(log_text: str) -> tuple[int | None, str | None]:
    """(global rank, exit code text) from torchrun's "Root Cause" report, if any."""
    m = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+[^\n]*)", log_text, re.S)
    if not m:
        return None, None
    return int(m.group(1)), m.group(2).strip()


def launch(module: str, config, *, nproc_per_node: int, out_dir: str | Path,
           nnodes: int = 1, rdzv_endpoint: str | None = None, timeout_s: float = 300.0,
           threads_per_rank: int | None = None, poll_s: float = 0.2,
           startup_s: float = STARTUP_S) -> LaunchResult:
    """Run ``python -m <module> <config.json>`` on ``nproc_per_node`` ranks with torchrun.
    ``module`` is an imported module's ``__name__`` (``worker.__name__``), so that the import
    graph shows what is launched.

    ``config``: a dataclass (the worker's :class:`~.worker_config.WorkerConfig`) or a mapping,
    written as ``config.json`` with ``out_dir``, ``threads`` and ``pg_timeout_s`` added. Each
    rank must write ``rank{RANK}.json`` into ``out_dir`` on success; it may write
    ``rank{RANK}.log``, ``.heartbeat`` and, on failure, ``.error``.

    ``timeout_s``: how long the ranks may make no progress (a stage changed, a step or a timed
    all-reduce done, a log grown) once every rank is in its training loop, so longer than the
    longest step; at least :data:`~..configs.checks.MIN_TIMEOUT_S`, since progress arrives
    with the heartbeats, once a second. Before that, while ranks import, the limit is the
    largest of ``timeout_s``, ``startup_s`` and :data:`STARTUP_S`; then, until every rank is in
    its training loop, and again once every rank is done, the larger of ``timeout_s`` and
    ``startup_s`` (:func:`allowed_silence_s`).

    Raises:
        ValueError: a bad argument (a count that is not positive, ``timeout_s`` under the
            minimum, a missing rendezvous endpoint), before anything starts.
        LaunchError: a rank failed, died or stopped progressing (named, with its last output), or
            torchrun could not start. No process is left behind.
    """
    if nproc_per_node <= 0:
        raise ValueError(f"'nproc_per_node' must be a positive integer (got {nproc_per_node})")
    if nnodes <= 0:
        raise ValueError(f"'nnodes' must be a positive integer (got {nnodes})")
    if not timeout_s >= MIN_TIMEOUT_S:  # progress arrives with the ranks' heartbeats
        raise ValueError(f"'timeout_s' must be at least {MIN_TIMEOUT_S:g} s: {MIN_TIMEOUT_WHY} "
                         f"(got {timeout_s})")
    if (nnodes > 1 or rdzv_endpoint is not None) and not rdzv_endpoint:
        raise ValueError("'rdzv_endpoint' (host:port) is required when nnodes > 1")
    world = nproc_per_node * nnodes
    if nnodes > 1 and "SLURM_JOB_ID" not in os.environ:
        raise LaunchError(f"nnodes={nnodes} needs a SLURM allocation (srun starts one "
                          "torchrun per node); run inside sbatch/salloc", kind="start",
                          world_size=world)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*"):
        f.unlink()
    cfg_path = out / "config.json"
    # to_json: the params (a frozen Params, a mapping) and any record in the config as plain data
    cfg_path.write_text(json.dumps({**to_json(config), "out_dir": str(out.resolve()),
                                    "threads": threads_per_rank,
                                    "pg_timeout_s": pg_timeout_s(timeout_s, startup_s)}, indent=1))
    if nnodes == 1 and rdzv_endpoint is None:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    else:
        rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint,
                "--rdzv-id", os.environ.get("SLURM_JOB_ID", "workbook")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0", *rdzv,
           "-m", module, str(cfg_path)]
    if nnodes > 1:  # one torchrun agent per allocated node
        cmd = ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *cmd]
    env = dict(os.environ)
    mark_run_root(env)  # the ranks' CPU figures count this run's whole process tree as its own
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
        last_progress, last_key, started = time.time(), None, False
        seen_beats: dict[int, tuple] = {}
        while True:
            try:
                for c in root.children(recursive=True):
                    known.setdefault(c.pid, c)
            except psutil.NoSuchProcess:
                pass
            for f in out.glob("rank*.pid"):  # ranks record their pids (and host)
                pid = local_pid(f)
                if pid is not None and pid not in known:
                    try:
                        known[pid] = psutil.Process(pid)
                    except psutil.Error:
                        pass
            # each beat's age on this host's clock (when its content last changed here), so that
            # another node's clock skew never makes a running rank look stale
            for r, b in read_heartbeats(out).items():
                if r not in seen_beats or seen_beats[r][0] != b.get("time"):
                    seen_beats[r] = (b.get("time"), time.time(), b)
            beats = {r: {**b, "time": local} for r, (_t, local, b) in seen_beats.items()}
            key = (tuple(sorted((r, b.get("stage"), b.get("progress")) for r, b in beats.items())),
                   tuple(p.stat().st_size for p in sorted(out.glob("rank*.log"))),
                   log.stat().st_size if log.exists() else 0)
            if key != last_key:
                last_key, last_progress = key, time.time()
            rc = proc.poll()
            if rc is not None:
                break
            # start-up (imports, rendezvous, models) until every rank reached the training loop
            if len(beats) == world and all(b.get("stage") == "training loop"
                                           for b in beats.values()):
                started = True
            allowed = allowed_silence_s(beats, world=world, nnodes=nnodes, started=started,
                                        timeout_s=timeout_s, startup_s=startup_s)
            # a rank that is done or failed stops beating on purpose: torchrun reports its end
            stale = [r for r in stale_ranks(beats)
                     if not str(beats[r].get("stage", "")).startswith("done")
                     and not (out / f"rank{r}.error").exists()]
            if stale or time.time() - last_progress > allowed:
                # a stopped rank is named as soon as its heartbeat is stale, long before the
                # ranks waiting for it reach their process-group timeout (pg_timeout_s)
                blame, why = diagnose_stall(beats, world=world if nnodes == 1 else None)
                tails = "\n".join(f"--- rank {r} last output ---\n{_tail(out / f'rank{r}.log')}"
                                  for r in (blame or sorted(beats)))
                silent = (f"made no progress for {allowed:.0f} s" if not stale else
                          "has a rank that stopped responding")
                raise LaunchError(
                    f"DDP launch (world size {world}) {silent}: "
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
        processes.terminate(known.values())  # local processes only (see local_pid)
