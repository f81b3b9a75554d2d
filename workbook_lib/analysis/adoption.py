"""Notebook 06: adopting the fix. The same model, from the same seed, trained on the same
batches with replicated masks (the Lazy model's pipeline) and with the node-mask shared graph; their
steps interleaved in one process. The loss curves must agree to float32 rounding; time, memory
and epochs per day are compared side by side."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measurement.timing import Stat
from ..records import Record
from ..training import loop
from ..training.factory import build_run

PIPELINES = {"replicated": ("replicated_mask_cpu", "gather_scatter"),
             "fix": ("node_mask_shared", "spmm")}


@dataclass
class AdoptionResult(Record):
    steps: int
    warmup_steps: int
    batch_size: int
    lr: float
    optimizer: str
    losses: dict[str, list[float]]
    rel_diff: list[float]  # |fix - replicated| / |replicated| per step
    max_rel_diff: float
    step: dict[str, Stat]  # seconds per step (timed steps)
    speedup: Stat  # replicated / fix, paired by round
    memory_per_sample: dict[str, float] = field(default_factory=dict)
    epochs_per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    projection_basis: str = ""
    device: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # the loss curves "agree" within this: 1e-5 on a CPU; on CUDA (atomic sums in any order) the
    # float32 accumulation bound of measurement.precision, if larger
    tolerance: float = 1e-5
    tolerance_basis: str = "float32 rounding (1e-5)"


def train_both(params: dict, graph, device: torch.device) -> tuple[dict, dict, int]:
    """Train both pipelines ``warmup + adopt_steps`` steps, interleaved; returns
    ``(arm results, losses, batch size)``."""
    b = params["batch_size_lazy"]
    steps, warm = params["adopt_steps"], params["warmup"]
    arms, runs = [], {}
    pert = None
    for key, (name, form) in PIPELINES.items():
        run = build_run(params, name, graph=graph, device=device, batch_size=b, form=form)
        if pert is None:  # the same samples, in the same order, for both
            pert = run.perturbations((steps + warm) * b)
        trainable = [p for p in run.model.parameters() if p.requires_grad]
        opt = (torch.optim.SGD(trainable, lr=params["adopt_lr"])
               if params["adopt_optimizer"] == "sgd" else
               torch.optim.AdamW(trainable, lr=params["adopt_lr"]))
        arm = loop.Arm(key, run.strategy, run.model, loop.make_loader(run.strategy, pert, b),
                       loop.Variant(key, "full"), dual=run.dual, optimizer=opt)
        arm.record_losses = True
        arms.append(arm)
        runs[key] = run
    # on CUDA each pipeline's own sums in a fixed order (deterministic kernels where PyTorch
    # has them; warn where it has none), so the comparison is of the two pipelines only
    cuda = torch.device(device).type == "cuda"
    was = torch.are_deterministic_algorithms_enabled()
    if cuda:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        res = loop.run_arms(arms, warmup_steps=warm, min_steps=steps, max_steps=steps,
                            budget_s=float("inf"), count_syncs=False, desc="06 training")
    finally:
        if cuda:
            torch.use_deterministic_algorithms(was)
    losses = {a.name: [float(x) for x in a.losses] for a in arms}
    return res, losses, b


def loss_tolerance(device_label: str, graph=None, layers: int = 1) -> tuple[float, str]:
    """How close the two loss curves must be to count as the same training: 1e-5 (float32
    rounding) on a CPU, whose sums run in a fixed order; on CUDA, whose atomic sums do not, the
    float32 accumulation bound for this graph (:mod:`workbook_lib.measurement.precision`) when it
    is larger."""
    if device_label.startswith("cuda") and graph is not None:
        from ..measurement.precision import float32_tolerance

        tol = float32_tolerance(graph, layers, floor=1e-5)
        return tol, (f"float32 accumulation in any order on CUDA ({tol:.1e}: eps x sqrt(in-degree)"
                     f" x {layers} layers, with margin)")
    return 1e-5, "float32 rounding (1e-5)"


def compare(params: dict, res: dict, losses: dict, batch_size: int, device_label: str, *,
            memory=None, ddp=None, graph=None) -> AdoptionResult:
    from ..training.loop import project_epochs

    rep, fix = losses["replicated"], losses["fix"]
    floor = 1e-3 * sorted(abs(x) for x in rep)[len(rep) // 2]  # a loss near 0: its scale
    rel = [abs(f - r) / max(abs(r), floor, 1e-30) for r, f in zip(rep, fix)]
    step = {k: r.step for k, r in res.items()}
    n = min(step["replicated"].n, step["fix"].n)
    speed = Stat.from_samples([a / b for a, b in zip(step["replicated"].samples[:n],
                                                     step["fix"].samples[:n])], unit="ratio")
    mem = {}
    if memory is not None:
        per = memory.per_sample()
        for key, (name, _form) in PIPELINES.items():
            if name in per:
                mem[key] = per[name]
    epochs, basis = {}, f"80% of {params['num_samples']:,} samples per epoch, 1 rank"
    factors, top, base = {}, 1, 1
    if ddp is not None and len(ddp.worlds) > 1:
        top, base = max(ddp.worlds), min(ddp.worlds)
        factors = getattr(ddp.gap, "step_factors", {}) or {}
        basis += (f"; {top} ranks: {top / base:g}x the samples per step at each pipeline's own "
                  "step factor measured in notebook 04 (none where 04 did not run it)")
    for key, st in step.items():
        one = project_epochs(st.median, batch_size, params["num_samples"])["epochs_per_day"]
        epochs[key] = {"1 rank": one}
        name = PIPELINES[key][0]
        if name in factors:
            epochs[key][f"{top} ranks"] = one * (top / base) / factors[name].median
    from ..strategies import REGISTRY

    return AdoptionResult(steps=params["adopt_steps"], warmup_steps=params["warmup"],
                          batch_size=batch_size, lr=params["adopt_lr"],
                          optimizer=params["adopt_optimizer"], losses=losses,
                          rel_diff=rel, max_rel_diff=max(rel), step=step, speedup=speed,
                          memory_per_sample=mem, epochs_per_day=epochs, projection_basis=basis,
                          device=device_label,
                          **dict(zip(("tolerance", "tolerance_basis"),
                                     loss_tolerance(device_label, graph, params["layers"]))),
                          labels={k: REGISTRY[n].label + (" (the Lazy model's form)"
                                                          if k == "replicated" else "")
                                  for k, (n, _f) in PIPELINES.items()})
