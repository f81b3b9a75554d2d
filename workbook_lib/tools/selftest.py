"""``python -m workbook_lib selftest [--device cuda] [--ranks N]``: check a machine before a long run.

At ``params/ci.yaml``'s sizes, each check says ``ok``, ``FAILED`` or ``skipped``, with why:
exactness on the device (the built-in strategies and ``convert``), the sync counter, the fix's
delta path at 3 layers, a memory probe, timing synchronization, the CPU share (``busy`` when
timings now would be contended) and, with ``--ranks`` >= 2, a DDP launch. Exit 1 when a check
failed, 2 for bad input. What each check does: docs/development.md.

Written here rather than with a test runner because it runs on the user's machine, outside the
test suite, and must print one table a user can read.
"""
from __future__ import annotations

import copy
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..configs.validation import Params
from ..common.text import text_table
from ..measurement.precision import float32_tolerance
from ..paths import REPO_ROOT
from ..configs.validation import ddp_strategy

OK, FAILED, SKIPPED, BUSY = "ok", "FAILED", "skipped", "busy"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    seconds: float = 0.0


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12)) if b.numel() else 0.0


def _outputs(strategy, model, pert, dual: bool, weights: torch.Tensor):
    from ..strategies import build_ctx

    model.zero_grad(set_to_none=True)
    ctx = build_ctx(strategy, pert)  # the host pipeline takes host perturbations
    out = strategy.node_outputs(model, ctx) if strategy.exact else None
    pred = strategy.predict(model, ctx, dual)
    loss = pred.sum() + ((out * weights.to(out.device)).sum() if out is not None else 0.0)
    loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return (None if out is None else out.detach().cpu()), pred.detach().cpu(), grads


def _deletions(num_genes: int) -> torch.Tensor:
    """The exactness checks' batch: three samples of up to three genes, one row padded."""
    pert = torch.tensor([[0, 5, 9], [1, 2, 3], [11, 4, -1]]) % num_genes
    pert[2, 2] = -1
    return pert


def check_exactness(params: Params, device: torch.device, graph) -> list[Check]:
    """Every strategy on ``device`` against the CPU (see the module docstring)."""
    from ..strategies import REGISTRY, make_strategy
    from ..strategies.reference import reference_node_outputs, reference_predict
    from ..pipelines.builtin import make_model

    tol = float32_tolerance(graph, params.layers)
    pert = _deletions(graph.num_genes)
    torch.manual_seed(0)
    weights = torch.randn(pert.shape[0], graph.num_genes, params.hidden)
    base = make_model(graph, params.model, "cpu", seed=params.seed)
    out = []
    ref = None
    for name, cls in REGISTRY.items():
        t0 = time.perf_counter()
        try:
            dual = bool(params.dual_forward) and cls.exact
            kw: dict = {"aggr": params.aggr}
            tmp = None
            if name == "replicated_mask_stored":
                tmp = tempfile.TemporaryDirectory()
                kw["storage_dir"] = tmp.name
            errs = {}
            runs = {}
            for where in ({"cpu", device.type} if device.type != "cpu" else {"cpu"}):
                dev = torch.device("cpu") if where == "cpu" else device
                s = make_strategy(name, graph, device=dev, **kw)
                if name == "replicated_mask_stored":
                    s.store(pert)
                model = copy.deepcopy(base).to(dev)
                runs[where] = _outputs(s.prepare(), model, pert, dual, weights)
            got = runs[device.type]
            if cls.exact:
                if ref is None or ref[0] != dual:
                    m = copy.deepcopy(base)
                    m.zero_grad(set_to_none=True)
                    r_out = reference_node_outputs(m, graph, pert, params.aggr)
                    r_pred = reference_predict(m, graph, pert, params.aggr, dual)
                    (r_pred.sum() + (r_out * weights).sum()).backward()
                    ref = (dual, r_out.detach(), r_pred.detach(),
                           {n: p.grad.detach().clone() for n, p in m.named_parameters()
                            if p.grad is not None})
                _, r_out, r_pred, r_g = ref
                errs["outputs vs reference"] = _rel(got[0], r_out)
                errs["prediction vs reference"] = _rel(got[1], r_pred)
                errs["gradients vs reference"] = max(
                    (_rel(got[2][k], r_g[k]) for k in r_g if k in got[2]), default=0.0)
                if set(got[2]) != set(r_g):
                    raise AssertionError(f"gradients of {sorted(set(got[2]) ^ set(r_g))} differ "
                                         "in presence from the reference")
            if device.type != "cpu":
                cpu = runs["cpu"]
                errs["prediction vs CPU"] = _rel(got[1], cpu[1])
                errs["gradients vs CPU"] = max((_rel(got[2][k], cpu[2][k]) for k in cpu[2]),
                                               default=0.0)
            worst = max(errs.values()) if errs else 0.0
            status = OK if worst <= tol else FAILED
            detail = (f"max relative error {worst:.2g} (tolerance {tol:.2g}, float32 "
                      "accumulation); " + ", ".join(f"{k} {v:.1g}" for k, v in errs.items()))
            if tmp is not None:
                tmp.cleanup()
        except Exception as exc:  # noqa: BLE001 - reported as the check's failure
            status, detail = FAILED, f"{type(exc).__name__}: {exc}"[:300]
        out.append(Check(f"exactness: {name}", status, detail, time.perf_counter() - t0))
    return out


def delta_layers(params: Params) -> int:
    """The depth at which the delta path is checked: at least 3 (it needs a middle layer)."""
    return max(3, int(params.layers))


def check_delta_exactness(params: Params, device: torch.device, graph) -> list[Check]:
    """The node-mask shared graph's delta path at :func:`delta_layers` on ``device`` against the
    plain CPU reference: node outputs, prediction (with the dual forward when the params ask)
    and every parameter's gradient, with the device's push kernel and, on a CPU, the PyTorch
    ``pull`` kernel too."""
    from ..nodemask.delta import default_push_kernel
    from ..pipelines.builtin import make_model
    from ..strategies import make_strategy
    from ..strategies.reference import reference_node_outputs, reference_predict

    layers = delta_layers(params)
    p = params.replace(layers=layers)
    tol = float32_tolerance(graph, layers)
    pert = _deletions(graph.num_genes)
    torch.manual_seed(0)
    weights = torch.randn(pert.shape[0], graph.num_genes, params.hidden)
    dual = bool(params.dual_forward)
    base = make_model(graph, p.model, "cpu", seed=p.seed)
    m = copy.deepcopy(base)
    m.zero_grad(set_to_none=True)
    r_out = reference_node_outputs(m, graph, pert, params.aggr)
    r_pred = reference_predict(m, graph, pert, params.aggr, dual)
    (r_pred.sum() + (r_out * weights).sum()).backward()
    r_g = {n: q.grad.detach().clone() for n, q in m.named_parameters() if q.grad is not None}
    kernels = [default_push_kernel(device)]
    if device.type == "cpu" and kernels[0] != "pull":
        kernels.append("pull")
    out = []
    for kernel in kernels:
        t0 = time.perf_counter()
        try:
            s = make_strategy("node_mask_shared", graph, device=device, aggr=params.aggr,
                              push_kernel=kernel)
            got = _outputs(s.prepare(), copy.deepcopy(base).to(device), pert, dual, weights)
            if set(got[2]) != set(r_g):
                raise AssertionError(f"gradients of {sorted(set(got[2]) ^ set(r_g))} differ "
                                     "in presence from the reference")
            errs = {"outputs": _rel(got[0], r_out), "prediction": _rel(got[1], r_pred),
                    "gradients": max((_rel(got[2][k], r_g[k]) for k in r_g), default=0.0)}
            worst = max(errs.values())
            status = OK if worst <= tol else FAILED
            detail = (f"max relative error {worst:.2g} (tolerance {tol:.2g}); "
                      + ", ".join(f"{k} {v:.1g}" for k, v in errs.items()))
        except Exception as exc:  # noqa: BLE001 - reported as the check's failure
            status, detail = FAILED, f"{type(exc).__name__}: {exc}"[:300]
        out.append(Check(f"exactness: node_mask_shared [delta, push {kernel}, L = {layers}]",
                         status, detail, time.perf_counter() - t0))
    return out


CONVERT_TOLERANCE = 1e-9  # float64: rounding only


def check_convert_exactness(params: Params, device: torch.device, graph) -> Check:
    """``workbook_lib.nodemask.convert`` on ``device``: a TorchCell-shaped encoder (per edge type
    a GIN with a two-layer MLP, LayerNorm, 3 layers, attention pooling over the kept genes) on
    the snapshot's first ``exactness_genes`` genes, in float64, against its B masked copies:
    predictions and every gradient (on a GPU the dense layer runs the batch as one block)."""
    from ..data.snapshots import induced_subgraph
    from ..studies.mask_cost.convert_bench import torchcell_exact_error

    t0 = time.perf_counter()
    name = "exactness: convert [TorchCell-shaped, float64]"
    try:
        small = induced_subgraph(graph, min(params.exactness_genes, graph.num_genes))
        pert = _deletions(small.num_genes)
        err = torchcell_exact_error(small, pert, hidden=8, layers=3, seed=params.seed,
                                    device=device)
        status = OK if err <= CONVERT_TOLERANCE else FAILED
        detail = (f"max relative error {err:.2g} (tolerance {CONVERT_TOLERANCE:g}) over "
                  f"predictions and every gradient, {small.num_genes} genes")
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        status, detail = FAILED, f"{type(exc).__name__}: {exc}"[:300]
    return Check(name, status, detail, time.perf_counter() - t0)


def check_delta_syncs(params: Params, device: torch.device, graph) -> Check:
    """One training step of the node-mask shared graph's delta path (after the collate, on the
    host) on ``device``: ``FAILED`` when it makes any host sync."""
    from ..measurement.syncs import SyncCounter
    from ..training.factory import build_run

    t0 = time.perf_counter()
    layers = delta_layers(params)
    name = f"syncs per step: node_mask_shared [delta, L = {layers}]"
    run = build_run(params, "node_mask_shared", graph=graph, device=device, layers=layers)
    pert = run.perturbations(run.batch_size)
    st = run.strategy.prepare()
    batch = st.to_device(st.collate([st.make_item(i, pert[i]) for i in range(len(pert))]))
    c = SyncCounter(device)
    with c.count():
        ctx = st.device_prepare(batch)
        st.predict(run.model, ctx, run.dual).sum().backward()
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(c.by_kind.items())) or "none"
    return Check(name, OK if c.total == 0 else FAILED,
                 f"{c.total} per step (batch {run.batch_size}, push "
                 f"{st.step_push_kernel()}): {kinds}", time.perf_counter() - t0)


def check_sync_counter(params: Params, device: torch.device, graph) -> list[Check]:
    """The counter both ways on this device, then each strategy's step counted."""
    from ..measurement.syncs import SyncCounter
    from ..strategies import REGISTRY
    from ..training.factory import build_run

    out = []
    t0 = time.perf_counter()
    x = torch.ones(64, device=device)
    quiet, loud = SyncCounter(device), SyncCounter(device)
    with quiet.count():
        (x * 2 + 1).sum()
    with loud.count():
        (x * 2).sum().item()
    ok = quiet.total == 0 and loud.total >= 1
    out.append(Check("sync counter: counts both ways", OK if ok else FAILED,
                     f"device arithmetic {quiet.total} (expected 0), an .item() {loud.total} "
                     f"(expected >= 1); {quiet.method}", time.perf_counter() - t0))
    for name in REGISTRY:
        t0 = time.perf_counter()
        tmp = tempfile.TemporaryDirectory()
        try:
            run = build_run(params, name, graph=graph, device=device, storage_dir=tmp.name)
            pert = run.perturbations(run.batch_size)
            if name == "replicated_mask_stored":
                run.strategy.store(pert)
            run.strategy.prepare()
            batch = run.strategy.collate([run.strategy.make_item(i, pert[i])
                                          for i in range(len(pert))])
            batch = run.strategy.to_device(batch)
            c = SyncCounter(device)
            with c.count():
                ctx = run.strategy.device_prepare(batch)
                run.strategy.predict(run.model, ctx, run.dual).sum().backward()
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(c.by_kind.items())) or "none"
            out.append(Check(f"syncs per step: {name}", OK,
                             f"{c.total} per step (batch {run.batch_size}): {kinds}",
                             time.perf_counter() - t0))
        except Exception as exc:  # noqa: BLE001
            out.append(Check(f"syncs per step: {name}", FAILED,
                             f"{type(exc).__name__}: {exc}"[:300], time.perf_counter() - t0))
        finally:
            tmp.cleanup()
    return out


def check_memory_probe(params: Params, device: torch.device) -> Check:
    from ..measurement import memory
    from ..training.step_memory import measure_point

    t0 = time.perf_counter()
    pt = measure_point(params, strategy="node_mask_shared", batch_size=2,
                       scale=params.scale, hidden=params.hidden,
                       layers=params.layers, device=str(device), timeout_s=120)
    ok = pt.status in (memory.STATUS_OK, memory.STATUS_BELOW)
    got = (f"{pt.step_bytes / 1e6:.3g} MB peak of one step ({pt.method})"
           if pt.step_bytes is not None else "")
    return Check("memory probe (fresh process)", OK if ok else FAILED,
                 f"{pt.status}: {got} {pt.reason or ''}".strip(), time.perf_counter() - t0)


def check_timing_sync(device: torch.device) -> Check:
    """A known amount of device work timed by the StepClock must take at least its length."""
    from ..measurement.timing import StepClock

    t0 = time.perf_counter()
    want = 0.05
    clock = StepClock(device)
    if device.type == "cuda":
        # calibrate a spin kernel with CUDA events, then time it with the StepClock
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        cycles = int(cycles * want / max(start.elapsed_time(end) / 1e3, 1e-6))

        def work():
            torch.cuda._sleep(cycles)
    else:
        def work():
            time.sleep(want)
    for timed in (False, True):
        with clock.step(timed=timed):
            with clock.stage("work"):
                work()
    got = clock.stages(["work"])["work"].median
    ok = got >= 0.8 * want
    return Check("timing synchronization", OK if ok else FAILED,
                 f"{want * 1e3:.0f} ms of device work measured as {got * 1e3:.1f} ms "
                 f"({'synchronized' if ok else 'the device was not waited for'})",
                 time.perf_counter() - t0)


def check_cpu_share(device: torch.device) -> Check:
    """What the process gets of the CPUs now, timing CPU-bound work as the loop does."""
    from ..measurement.cpu import fit_threads
    from ..measurement.timing import StepClock

    t0 = time.perf_counter()
    clock = StepClock(device)
    x = torch.randn(384, 384)

    def work():
        y = x
        for _ in range(8):
            y = torch.tanh(y @ x * 1e-3)
    for i in range(21):
        with clock.step(timed=i > 0):
            work()
    st = clock.wall()
    fit = fit_threads()
    busy = st.contended
    detail = (f"{st.cpu.describe()}; threads: {fit.why}"
              + (f"; timings taken now are marked contended: {st.cpu.explain()}"
                 if busy else ""))
    return Check("CPU share", BUSY if busy else OK, detail, time.perf_counter() - t0)


def check_ddp(params: Params, device: torch.device, ranks: int) -> Check:
    """A short torchrun launch of the DDP worker with the comm hook."""
    from ..studies.ddp import summary
    from ..distributed import launcher, worker
    from ..distributed.worker_config import WorkerConfig

    t0 = time.perf_counter()
    if ranks < 2:
        return Check("DDP launch (torchrun)", SKIPPED, "needs --ranks 2 or more")
    if device.type == "cuda" and torch.cuda.device_count() < ranks:
        return Check("DDP launch (torchrun)", SKIPPED,
                     f"{ranks} ranks need {ranks} GPUs, {torch.cuda.device_count()} visible")
    if len(params.gap_strategies) != 2:
        return Check("DDP launch (torchrun)", SKIPPED, "the params compare one pipeline (the DDP "
                     "launch times two)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    p = params.replace(backend=backend, device=device.type)
    slow, fast = p.gap_strategies
    cfg = WorkerConfig(params=p, scaling_strategy=ddp_strategy(p), gap_strategies=[slow, fast],
                       batch_size=p.ddp_batch_size, global_batch=p.ddp_batch_size * ranks,
                       steps=2, steps_cap=2, warmup=1, budget_s=30, timeout_s=120)
    with tempfile.TemporaryDirectory() as d:
        try:
            res = launcher.launch(worker.__name__, cfg, nproc_per_node=ranks,
                                  out_dir=d, timeout_s=120, threads_per_rank=1)
            s = summary.summarize(res.ranks, scaling=ddp_strategy(p), gap=[slow, fast],
                                  procs_per_node=ranks, nnodes=1)
            ok = len(s.comm_per_rank) == ranks and all(c.hook.median > 0
                                                       for c in s.comm_per_rank.values())
            detail = (f"{ranks} ranks, {s.backend}: comm hook per rank "
                      + ", ".join(f"{r}: {c.hook.median * 1e3:.3g} ms"
                                  for r, c in s.comm_per_rank.items())
                      + f"; {s.comm_method}")
            return Check("DDP launch (torchrun)", OK if ok else FAILED, detail,
                         time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001
            return Check("DDP launch (torchrun)", FAILED, f"{type(exc).__name__}: "
                         f"{str(exc).splitlines()[0]}"[:300], time.perf_counter() - t0)


def run_selftest(device: str = "auto", ranks: int | None = None,
                 params_path: str | Path | None = None,
                 only: list[str] | None = None) -> list[Check]:
    """Every check (``only``: those whose names start so).

    Raises:
        ValueError: ``device`` not cpu, cuda or auto, ``cuda`` without a CUDA device, or ``ranks`` < 1.
    """
    from ..data.snapshots import load_snapshot
    from ..common.device import resolve_device
    from ..configs.validation import load_params_file

    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"'--device' must be cpu, cuda or auto (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("'--device cuda': no CUDA device is visible to PyTorch "
                         f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    if ranks is not None and ranks < 1:
        raise ValueError(f"'--ranks' must be a positive integer (got {ranks})")
    checks = ("exactness", "syncs", "memory", "timing", "cpu", "ddp")
    unknown = [o for o in only or [] if not any(c.startswith(o) for c in checks)]
    if unknown:
        raise ValueError(f"'--only {unknown[0]}' names no check (checks: {', '.join(checks)})")
    params = load_params_file(params_path or REPO_ROOT / "params" / "ci.yaml")
    params = params.replace(device=device)
    dev = resolve_device(device)
    if ranks is None:
        ranks = torch.cuda.device_count() if dev.type == "cuda" else 1
    graph = load_snapshot(params.data)
    steps: list[tuple[str, Callable[[], list[Check] | Check]]] = [
        ("exactness", lambda: check_exactness(params, dev, graph)
         + check_delta_exactness(params, dev, graph)
         + [check_convert_exactness(params, dev, graph)]),
        ("syncs", lambda: check_sync_counter(params, dev, graph)
         + [check_delta_syncs(params, dev, graph)]),
        ("memory", lambda: check_memory_probe(params, dev)),
        ("timing", lambda: check_timing_sync(dev)),
        ("cpu", lambda: check_cpu_share(dev)),
        ("ddp", lambda: check_ddp(params, dev, ranks)),
    ]
    out: list[Check] = []
    for key, fn in steps:
        if only and not any(key.startswith(o) for o in only):
            continue
        try:
            got = fn()
        except Exception as exc:  # noqa: BLE001 - one broken check does not hide the others
            got = Check(key, FAILED, f"{type(exc).__name__}: {exc}"[:300] + "\n"
                        + traceback.format_exc(limit=2))
        out.extend(got if isinstance(got, list) else [got])
    return out


def format_table(checks: list[Check], device: str) -> str:
    lines = [f"workbook self-test on {device} (torch {torch.__version__})", "",
             *text_table([[c.name, c.status, f"{c.seconds:.1f} s", c.detail] for c in checks],
                         "<<>")]
    bad = [c for c in checks if c.status == FAILED]
    busy = [c for c in checks if c.status == BUSY]
    lines += ["", f"{len(checks) - len(bad)} of {len(checks)} checks passed or skipped"
              + (f" ({len(busy)} found the machine busy)" if busy else "")
              + (f"; FAILED: {', '.join(c.name for c in bad)}" if bad else "")]
    return "\n".join(lines)
