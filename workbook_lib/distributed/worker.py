"""One DDP rank, started by torchrun: ``python -m workbook_lib.distributed.worker CONFIG.json``.

Every rank runs notebook 03's training loop (:mod:`workbook_lib.training.loop`) on
``DistributedDataParallel`` models, with the plan's threads and workers, interleaving in one
launch the scaling strategy's variants (``ddp``, ``no_sync``, ``accum_last``/``accum_every``,
``gather``, ``strong``), the two gap strategies and, at the smallest world size, the same again
with ``threads_all`` threads. :class:`CommTimer` times each bucket's all-reduce; the plain
all-reduce of gradient-sized buffers is timed after a barrier. Each rank writes ``rank{R}.json``,
``.log``, ``.heartbeat`` (every second), ``.error`` and, for a pipeline's own failure,
``.failure.json`` (docs/development.md).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from ..records import to_json
from .worker_config import WorkerConfig


class Heartbeat:
    """Writes ``{"time", "stage", "pid"}`` to a file every second from a daemon thread."""

    def __init__(self, path: Path, interval: float = 1.0):
        self.path, self.interval, self.stage = path, interval, "starting"
        self.progress = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        # the beat thread and the rank's own stage changes both write; one temp file, one lock
        self._lock = threading.Lock()

    def start(self) -> "Heartbeat":
        self._write()
        self._thread.start()
        return self

    def set(self, stage: str) -> None:
        self.stage = stage
        self.progress += 1
        self._write()

    def tick(self) -> None:
        """One more unit of progress (a training step, a timed all-reduce); written with the
        next beat."""
        self.progress += 1

    def _write(self) -> None:
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"time": time.time(), "stage": self.stage,
                                       "progress": self.progress, "pid": os.getpid(),
                                       "host": socket.gethostname()}))
            os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write()
            except OSError:
                pass

    def stop(self) -> None:
        self._stop.set()


class CommTimer:
    """A DDP comm hook that all-reduces (mean) each bucket and times it from its gradients being
    ready to the all-reduce finished (host clock with gloo, CUDA events with NCCL); also the loop's
    step hooks (``begin_step``/``end_step``) that put the step's totals into its stage record.
    ``delay_s`` (a test hook) sleeps before each step, making this rank the slow one.
    """

    def __init__(self, world: int, device: torch.device, heartbeat: Heartbeat | None = None,
                 delay_s: float = 0.0, threads: int | None = None):
        self.world, self.device, self.heartbeat = world, device, heartbeat
        self.threads = threads  # intra-op threads this arm's steps run with
        self.cuda = device.type == "cuda"
        self.delay_s = delay_s
        self.calls: list = []  # host seconds (CPU) or CUDA events (bucket ready)
        self.done: list = []  # host seconds (CPU) or CUDA events (all-reduce finished)
        self._lock = threading.Lock()

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            return ev
        return time.perf_counter()

    def hook(self, state, bucket):
        buf = bucket.buffer()
        buf.div_(self.world)
        t_call = self._now()
        with self._lock:
            self.calls.append(t_call)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def finished(f):
            t_done = self._now()
            with self._lock:
                self.done.append(t_done)
            return f.value()[0]
        return fut.then(finished)

    def begin_step(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.tick()
        if self.threads and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            self.calls, self.done = [], []

    def bucket_seconds(self) -> list[tuple[float, float]]:
        """This step's buckets as (ready, finished) seconds from the first bucket's readiness."""
        with self._lock:
            calls, done = list(self.calls), list(self.done)
        if not calls or len(calls) != len(done):
            return []
        if self.cuda:
            for d in done:  # the futures may complete in any order: wait for every one
                d.synchronize()
            t0 = calls[0]
            # elapsed_time is in ms; the futures may complete out of order: pair by order
            ready = sorted(t0.elapsed_time(c) / 1e3 for c in calls)
            fin = sorted(t0.elapsed_time(d) / 1e3 for d in done)
        else:
            ready = [c - min(calls) for c in sorted(calls)]
            fin = [d - min(calls) for d in sorted(done)]
        return list(zip(ready, fin))

    def end_step(self, clock) -> None:
        pairs = self.bucket_seconds()
        if pairs:
            clock.add("comm_total", sum(d - c for c, d in pairs))
            clock.add("comm_exposed", max(0.0, max(d for _, d in pairs) -
                                          max(c for c, _ in pairs)))
            clock.add("buckets", float(len(pairs)))


def _log(fh, msg: str) -> None:
    fh.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
    fh.flush()


def resolve_backend(backend: str, device_pref: str) -> tuple[str, torch.device]:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() and device_pref in ("cuda", "auto")
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs CUDA devices, none is available")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} has no GPU "
                               f"({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(local_rank)
        return backend, torch.device("cuda", local_rank)
    if use_cuda and local_rank < torch.cuda.device_count():
        return backend, torch.device("cuda", local_rank)
    return backend, torch.device("cpu")


def main(cfg_path: str) -> None:
    from ..measurement.cpu import ROOT_ENV, run_root
    from .launcher import set_parent_death_signal

    set_parent_death_signal()  # torchrun gone: stop too
    if run_root() == os.getpid():  # the launcher's root is on another node (srun) or unnamed:
        os.environ[ROOT_ENV] = str(os.getppid())  # this node's torchrun agent and its ranks
    cfg = WorkerConfig.from_json(json.loads(Path(cfg_path).read_text()))
    out = Path(cfg.out_dir)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # the host with the pid: on several nodes the launcher signals only its own host's ranks
    (out / f"rank{rank}.pid").write_text(json.dumps({"pid": os.getpid(),
                                                     "host": socket.gethostname()}))
    hb = Heartbeat(out / f"rank{rank}.heartbeat").start()
    fh = open(out / f"rank{rank}.log", "a")
    try:
        _main(cfg, out, rank, world, fh, hb)
    except BaseException as exc:
        from ..failures import PipelineFailed

        if isinstance(exc, PipelineFailed):
            f = exc.failure
            f.notebook, f.rank = "04", rank
            (out / f"rank{rank}.failure.json").write_text(json.dumps(f.to_json()))
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        _log(fh, "FAILED:\n" + traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - teardown after a failure
                pass
        hb.stop()  # after the teardown: a rank tearing down is not a stopped rank
        fh.close()


def _agree(stop: bool, device: torch.device) -> bool:
    """Every rank stops an arm together: stop when all ranks want to (MIN of their flags).

    The flag lives on the rank's device: NCCL serves only CUDA tensors, so every collective of
    the worker takes ``device``; the one ``.item()`` per round is the stop decision itself."""
    t = torch.tensor([1 if stop else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _barrier(device: torch.device) -> None:
    """A barrier on the rank's device (NCCL needs the device id, else it guesses one)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def time_allreduces(sizes: list[int], device: torch.device, repeats: int,
                    tick: Callable[[], None] | None = None) -> list[dict]:
    """The all-reduce of buffers of ``sizes`` bytes on ``device``, each repeat after a barrier
    and between device syncs (so no rank waits for another inside the timed region); ``tick``
    (the heartbeat's) after each size's warm-up and each repeat, so that the launcher sees the
    phase progress."""
    from ..measurement.timing import Stat, sync

    out = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), device=device)
        for _ in range(2):
            dist.all_reduce(buf)
        if tick is not None:
            tick()
        samples = []
        for _ in range(repeats):
            _barrier(device)
            sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync(device)
            samples.append(time.perf_counter() - t0)
            if tick is not None:
                tick()
        out.append({"bytes": buf.numel() * 4, "seconds": Stat.from_samples(samples)})
    return out


def _main(cfg: WorkerConfig, out, rank, world, fh, hb):
    from ..common.device import configure_cpu_allocator
    from ..data.snapshots import load_snapshot
    from ..pipelines import build_pipeline, is_builtin
    from ..training import loop

    P = cfg.params
    threads = int(cfg.threads or torch.get_num_threads())
    threads_all = cfg.threads_all  # the thread-effect arms (smallest world size only)
    workers = int(cfg.workers) if cfg.workers is not None else P.num_workers
    torch.set_num_threads(threads)
    alloc = configure_cpu_allocator(P.cpu_allocator_cache)
    backend, device = resolve_backend(P.backend, P.device)
    _log(fh, f"rank {rank}/{world} backend {backend} device {device} threads "
             f"{torch.get_num_threads()}")
    hb.set("init_process_group (rendezvous)")
    # longer than the launcher's stall detection, so that a stopped rank is named by the launcher
    # before the ranks waiting for it time out and blame themselves
    pg_timeout = float(cfg.pg_timeout_s or cfg.timeout_s)
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=pg_timeout))
    if cfg.fail_rank == rank:
        raise RuntimeError(f"injected failure on rank {rank} (test hook)")
    if cfg.hang_rank == rank:
        hb.set("hanging (test hook)")
        _log(fh, "hanging (test hook)")
        time.sleep(3600)
    hb.set("setup")
    if cfg.slow_rank == rank and cfg.slow_start_s:
        time.sleep(float(cfg.slow_start_s))  # test hook: a start-up stage longer than the limit
    gap = cfg.gap_strategies
    scaling = cfg.scaling_strategy
    global_batch = cfg.global_batch
    arms, comm = [], {}
    modules = {}

    graph = load_snapshot(P.data)

    def ddp_run(name: str, batch: int | None, tag: str, arm_threads: int | None = None):
        hb.set(f"preparing {name} ({tag})")
        distinct = min(max(8, cfg.steps_cap), 64)  # the stream cycles over them
        try:  # checked once, by the CLI or notebook 03: here only built
            pipe = build_pipeline(P, name, graph, device, batch_size=batch,
                                  n_items=distinct * (batch or 1) * P.grad_accum_steps,
                                  salt=1000 * rank + len(modules), check=False)
        except Exception as exc:  # noqa: BLE001 - this pipeline's: recorded as its failure
            from ..failures import PipelineFailed, failure_from

            raise PipelineFailed(failure_from(exc, pipeline=name, notebook="04",
                                              stage="build", mode=tag)) from exc
        hb.set(f"DistributedDataParallel({tag}) (broadcast)")
        model = torch.nn.parallel.DistributedDataParallel(
            pipe.model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=P.bucket_cap_mb)
        hb.set(f"building the data pipeline ({tag})")
        timer = CommTimer(world, device, hb,
                          delay_s=float(cfg.slow_rank_delay_s)
                          if cfg.slow_rank == rank else 0.0,
                          threads=arm_threads or threads)
        model.register_comm_hook(None, timer.hook)
        opt = pipe.configure_optimizer([p for p in pipe.model.parameters() if p.requires_grad])
        ld = loop.make_loader(pipe, num_workers=workers, pin_memory=P.pin_memory,
                              persistent_workers=P.persistent_workers,
                              stall_timeout_s=P.stall_timeout_s)
        modules[tag] = model
        comm[tag] = timer
        return pipe, model, opt, ld, timer

    pipe, model, opt, ld, timer = ddp_run(scaling, cfg.batch_size, "scaling")
    a = P.grad_accum_steps
    # the loss-side all-gather needs a loss that can gather (the built-in pipelines' can)
    gather = P.use_ddp_gather and is_builtin(scaling)
    variants = [loop.Variant("ddp", "full", gather=gather),
                loop.Variant("no_sync", "full", allreduce="never", gather=False),
                loop.Variant("accum_last", "full", micro_batches=a, allreduce="last"),
                loop.Variant("accum_every", "full", micro_batches=a, allreduce="every")]
    if is_builtin(scaling):
        variants.append(loop.Variant("gather", "full", gather=not gather))
    for v in variants:
        arms.append(loop.Arm(f"{scaling}/{v.name}", pipe, ld, v, model=model, optimizer=opt,
                             hooks=timer))
    strong_b = global_batch // world
    spipe, smodel, sopt, sld, stimer = ddp_run(scaling, strong_b, "strong")
    arms.append(loop.Arm(f"{scaling}/strong", spipe, sld,
                         loop.Variant("strong", "full", gather=gather), model=smodel,
                         optimizer=sopt, hooks=stimer))
    for name in gap:
        gpipe, gmodel, gopt, gld, gtimer = ddp_run(name, None, f"gap:{name}")
        arms.append(loop.Arm(f"{name}/gap", gpipe, gld,
                             loop.Variant("ddp", "full",
                                          gather=P.use_ddp_gather and is_builtin(name)),
                             model=gmodel, optimizer=gopt, hooks=gtimer))
    if threads_all and world == 1:  # the same arms with the whole share: the thread effect
        tpipe, tmodel, topt, tld, ttimer = ddp_run(scaling, cfg.batch_size, "all-threads",
                                                   int(threads_all))
        arms.append(loop.Arm(f"{scaling}/ddp@all-threads", tpipe, tld,
                             loop.Variant("ddp", "full", gather=gather), model=tmodel,
                             optimizer=topt, hooks=ttimer))
        for name in gap:
            gpipe, gmodel, gopt, gld, gtimer = ddp_run(name, None, f"gap:{name}:all-threads",
                                                       int(threads_all))
            arms.append(loop.Arm(f"{name}/gap@all-threads", gpipe, gld,
                                 loop.Variant("ddp", "full",
                                              gather=P.use_ddp_gather and is_builtin(name)),
                                 model=gmodel, optimizer=gopt, hooks=gtimer))
    hb.set("training loop")
    _log(fh, f"{len(arms)} arms interleaved, {cfg.steps}..{cfg.steps_cap} timed steps each")

    def agree(flag: bool) -> bool:
        hb.set("agreeing to stop (all-reduce)")
        r = _agree(flag, device)
        hb.set("training loop")
        return r
    results = loop.run_arms(arms, warmup_steps=cfg.warmup, min_steps=cfg.steps,
                            max_steps=cfg.steps_cap, target=P.precision_target,
                            budget_s=cfg.budget_s, interleave=workers == 0,
                            count_syncs=False, agree=agree, desc=f"rank {rank}",
                            stall_timeout_s=P.stall_timeout_s, notebook="04",
                            procs=int(os.environ.get("LOCAL_WORLD_SIZE") or world))
    torch.set_num_threads(threads)
    logging = {}
    for tag, m in modules.items():
        try:
            data = m._get_ddp_logging_data()
            logging[tag] = {k: v for k, v in data.items() if isinstance(v, (int, float)) and
                            ("time" in k or "bucket" in k or "comm" in k)}
        except Exception as exc:  # noqa: BLE001 - a private API: recorded if it changes
            logging[tag] = {"unavailable": str(exc)}
    # all-reduce of buffers the size of the gradients (and others, for the ring model)
    grad_bytes = sum(p.numel() * p.element_size() for p in pipe.model.parameters()
                     if p.requires_grad)
    hb.set("timing all-reduces (collective)")
    sizes = sorted({4096, 65536, 1 << 20, 4 << 20, 16 << 20, grad_bytes})
    allreduce = time_allreduces(sizes, device, max(5, cfg.steps), tick=hb.tick)
    doc = {"rank": rank, "world_size": world, "backend": backend, "device": str(device),
           "threads": threads, "threads_all": threads_all if world == 1 else None,
           "workers": workers, "cpu_allocator": alloc,
           "grad_bytes": grad_bytes, "global_batch": global_batch, "strong_batch": strong_b,
           "arms": results, "allreduce": allreduce, "ddp_logging": logging,
           "comm_method": ("DDP comm hook: each bucket from its gradients being ready to its "
                           "all-reduce finishing, " +
                           ("CUDA events on the stream" if device.type == "cuda" else
                            "host clock (gloo completes the future with the collective)"))}
    (out / f"rank{rank}.json").write_text(json.dumps(to_json(doc)))
    hb.set("done (final barrier)")
    _log(fh, "done")
    _barrier(device)


if __name__ == "__main__":
    main(sys.argv[1])
