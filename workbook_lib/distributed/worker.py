"""One DDP rank, started by torchrun: ``python -m workbook_lib.ddp_worker CONFIG.json``.

Measures, per strategy, training steps under ``DistributedDataParallel`` (weak scaling: the
per-rank batch is fixed), the same steps under ``no_sync()`` (compute only), strong scaling
(the global batch fixed), gradient accumulation with and without ``no_sync()`` at the same
effective batch, the loss-side all-gather on and off, and timed all-reduces of several sizes.
Each rank writes ``rank{RANK}.json``; progress goes to ``rank{RANK}.log``; a failure writes
``rank{RANK}.error`` (traceback) before the process exits non-zero.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist


def _log(fh, msg: str) -> None:
    fh.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
    fh.flush()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resolve_backend(backend: str, device_pref: str) -> tuple[str, torch.device]:
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
    return backend, (torch.device("cuda", local_rank) if use_cuda and
                     local_rank < torch.cuda.device_count() else torch.device("cpu"))


def _loss(pred, y, gather: bool):
    if gather:  # the brief's use_ddp_gather: the loss sees every rank's predictions
        from torch.distributed.nn.functional import all_gather
        pred = torch.cat(all_gather(pred))
        y = torch.cat(all_gather(y))
    return ((pred - y) ** 2).mean()


def _run_variant(ddp_model, strategy, ctxs, labels, *, steps, warmup, device, opt,
                 no_sync=False, accum=1, accum_no_sync=True, gather=False, dual=False, fh=None,
                 tag=""):
    """Time ``warmup + steps`` optimizer steps; each is ``accum`` micro-batches."""
    times = {"step": [], "forward": [], "backward": [], "optimizer": []}
    n = len(ctxs)
    i = 0
    for step in range(warmup + steps):
        f = b = 0.0
        _sync(device)
        t0 = time.perf_counter()
        for micro in range(accum):
            ctx, y = ctxs[i % n], labels[i % n]
            i += 1
            skip = no_sync or (accum_no_sync and micro < accum - 1)
            cm = ddp_model.no_sync() if skip else nullcontext()
            with cm:
                _sync(device)
                ta = time.perf_counter()
                pred = ddp_model(strategy, ctx, dual=dual)  # DDP's forward arms the reducer
                loss = _loss(pred, y, gather)
                _sync(device)
                tb = time.perf_counter()
                loss.backward()
                _sync(device)
                tc = time.perf_counter()
            f += tb - ta
            b += tc - tb
        td = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        te = time.perf_counter()
        if step >= warmup:
            times["step"].append(te - t0)
            times["forward"].append(f)
            times["backward"].append(b)
            times["optimizer"].append(te - td)
        if fh is not None:
            _log(fh, f"{tag} step {step + 1}/{warmup + steps} {te - t0:.4f}s")
    return times


def main(cfg_path: str) -> None:
    cfg = json.loads(Path(cfg_path).read_text())
    out = Path(cfg["out_dir"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    fh = open(out / f"rank{rank}.log", "a")
    try:
        _main(cfg, out, rank, world, fh)
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        _log(fh, "FAILED:\n" + traceback.format_exc())
        raise
    finally:
        fh.close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - teardown after a failure
                pass


def _main(cfg, out, rank, world, fh):
    from ..strategies.model import PerturbGIN
    from ..data.perturbations import sample_perturbations
    from ..data.snapshots import load_snapshot
    from ..strategies import build_ctx, make_strategy
    from ..training.loop import synthetic_labels

    from ..running.params import validate

    P = validate(cfg["params"], source="ddp worker config")  # JSON round trip: same schema
    backend, device = _resolve_backend(P["backend"], P["device"])
    _log(fh, f"rank {rank}/{world} backend {backend} device {device} "
             f"threads {torch.get_num_threads()}")
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=cfg["timeout_s"]))
    if cfg.get("fail_rank") == rank:
        raise RuntimeError(f"injected failure on rank {rank} (test hook)")
    if cfg.get("hang_rank") == rank:
        _log(fh, "hanging (test hook)")
        time.sleep(3600)
    graph = load_snapshot(P)
    result = {"rank": rank, "world_size": world, "backend": backend, "device": str(device),
              "threads": torch.get_num_threads(), "strategies": {}}
    steps, warmup = cfg["steps"], cfg["warmup"]
    for spec in cfg["strategies"]:
        name, bsz = spec["name"], spec["batch_size"]
        full = spec.get("full", False)
        strategy = make_strategy(name, graph, aggr=P["aggr"], device=device)
        model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=P["hidden"],
                           layers=P["layers"], seed=P["seed"]).to(device)
        if name != "dango_wildtype":
            model.query.requires_grad_(False)  # unused by exact strategies; DDP must skip it
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=P["bucket_cap_mb"])
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                         if p.requires_grad)
        dual = P["dual_forward"] and strategy.exact

        def ctx_pool(batch, count=2, salt=0):
            perts = [sample_perturbations(graph.num_genes, P["perturbation_k"], batch,
                                          seed=P["seed"] + 1000 * rank + 17 * salt + c)
                     for c in range(count)]
            return ([build_ctx(strategy, p.to("cpu")) for p in perts],
                    [synthetic_labels(p).to(device) for p in perts])
        ctxs, labels = ctx_pool(bsz)
        res = {"batch_size": bsz, "grad_bytes": grad_bytes}
        common = dict(steps=steps, warmup=warmup, device=device, opt=opt, dual=dual, fh=fh)
        res["ddp"] = _run_variant(ddp, strategy, ctxs, labels, gather=P["use_ddp_gather"],
                                  tag=f"{name} ddp", **common)
        res["no_sync"] = _run_variant(ddp, strategy, ctxs, labels, no_sync=True,
                                      gather=False, tag=f"{name} no_sync", **common)
        if full:
            res["ddp_gather_toggled"] = _run_variant(
                ddp, strategy, ctxs, labels, gather=not P["use_ddp_gather"],
                tag=f"{name} gather={not P['use_ddp_gather']}", **common)
            sb = max(1, bsz // world)
            sctx, slab = ctx_pool(sb, salt=1)
            res["strong"] = _run_variant(ddp, strategy, sctx, slab, gather=P["use_ddp_gather"],
                                         tag=f"{name} strong B={sb}", **common)
            res["strong_batch_size"] = sb
            a = P["grad_accum_steps"]
            res["accum_no_sync"] = _run_variant(ddp, strategy, ctxs, labels, accum=a,
                                                accum_no_sync=True, tag=f"{name} accum no_sync",
                                                **common)
            res["accum_sync_every"] = _run_variant(ddp, strategy, ctxs, labels, accum=a,
                                                   accum_no_sync=False,
                                                   tag=f"{name} accum sync-every", **common)
            res["accum_steps"] = a
            try:
                logging_data = ddp._get_ddp_logging_data()
                res["ddp_logging"] = {k: v for k, v in logging_data.items()
                                      if isinstance(v, (int, float)) and
                                      ("time" in k or "bucket" in k or "comm" in k)}
            except Exception as exc:  # noqa: BLE001 - private API, best effort, recorded
                res["ddp_logging"] = {"unavailable": str(exc)}
            result["grad_bytes"] = grad_bytes
        result["strategies"][name] = res
        del ddp, model, opt
    # timed all-reduce at several sizes (for the ring model)
    sizes = sorted({4096, 65536, 1 << 20, 4 << 20, int(result.get("grad_bytes", 1 << 20))})
    ar = []
    for nbytes in sizes:
        t = torch.zeros(max(1, nbytes // 4), device=device)
        for _ in range(2):
            dist.all_reduce(t)
        _sync(device)
        samples = []
        for _ in range(max(3, steps)):
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            _sync(device)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        ar.append({"bytes": t.numel() * 4, "seconds": samples[len(samples) // 2]})
    result["allreduce"] = ar
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    _log(fh, "done")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
