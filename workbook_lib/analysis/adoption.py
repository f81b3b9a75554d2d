"""Notebook 06: adopting the fix. The same model, from the same seed, trained on the same
batches with replicated masks (the Lazy model's pipeline) and with the node-mask shared graph; their
steps interleaved in one process. The loss curves must agree to float32 rounding; time, memory
and epochs per day are compared side by side.

How the curves are compared: a loss that falls near 0 cannot be compared by its own relative
difference (float32 rounds the *predictions*, and a residual of 1e-3 on predictions of 0.2 turns
their rounding into a relative loss difference far above it). The loss is a mean squared error,
so each step's pair of losses bounds the predictions' difference: with ``e = sqrt(loss)`` the
batch's RMS error, ``|e_fix - e_rep| <= RMS(p_fix - p_rep)`` (Minkowski) and
``RMS(p_rep) <= max|y| + e_rep``. :func:`implied_prediction_diff` is therefore a lower bound of
the predictions' relative RMS difference, compared with the tolerance of a float32 result.

The target is learnable, so that "the same training" is shown on a model that learns: every
sample's label is a fixed *teacher*'s prediction (the same architecture and forward from another
seed, run exactly on the sample's perturbed graph). :func:`loss_fall` says how far the loss fell,
and the labels' variance is the loss of a model that predicts only their mean: a loss below it
has learned how the label depends on the perturbation."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measurement.timing import Stat
from ..records import Record
from ..data.perturbations import sample_perturbations
from ..pipelines import build_pipeline
from ..training import loop

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
    # per step: the least relative RMS difference of the predictions that the losses imply
    rel_diff: list[float]
    max_rel_diff: float
    step: dict[str, Stat]  # seconds per step (timed steps)
    speedup: Stat  # replicated / fix, paired by round
    memory_per_sample: dict[str, float] = field(default_factory=dict)
    epochs_per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    projection_basis: str = ""
    device: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    label_variance: float | None = None  # the loss of predicting the labels' mean
    # the loss curves "agree" within this: 1e-5 on a CPU; on CUDA (atomic sums in any order) the
    # float32 accumulation bound of measurement.precision, if larger
    tolerance: float = 1e-5
    tolerance_basis: str = "float32 rounding (1e-5)"


def implied_prediction_diff(rep: list[float], fix: list[float], label_max: float) -> list[float]:
    """Per step, the least relative RMS difference of the two pipelines' predictions that their
    MSE losses imply (see the module docstring): ``|sqrt(f) - sqrt(r)| / (label_max + sqrt(max(r,
    f)))``.

    Args:
        rep: the reference pipeline's loss per step (mean squared error).
        fix: the other pipeline's, the same steps.
        label_max: the largest absolute label (bounds the predictions' RMS with the error).
    """
    if len(rep) != len(fix):
        raise ValueError(f"the loss curves must have equal length (got {len(rep)} and "
                         f"{len(fix)})")
    if label_max < 0 or any(x < 0 for x in (*rep, *fix)):
        raise ValueError("losses and 'label_max' must be >= 0 (mean squared errors)")
    out = []
    for r, f in zip(rep, fix):
        er, ef = r ** 0.5, f ** 0.5
        scale = label_max + max(er, ef)
        out.append(abs(ef - er) / scale if scale > 0 else 0.0)
    return out


TEACHER_SEED_OFFSET = 1000  # the teacher's weights: the run's seed plus this


def teacher_labels(params: dict, graph, device: torch.device, pert: torch.Tensor,
                   batch_size: int) -> torch.Tensor:
    """Each sample's label from a fixed teacher (see the module docstring), on the host.

    Args:
        params: the run's params (the teacher uses ``seed + TEACHER_SEED_OFFSET``).
        graph: the cell graph.
        device: where the teacher runs.
        pert: ``[n, k]`` perturbations.
        batch_size: samples per teacher forward.
    """
    from ..strategies import build_ctx
    from ..training.factory import build_run

    t = build_run({**params, "seed": params["seed"] + TEACHER_SEED_OFFSET}, "node_mask_shared",
                  graph=graph, device=device, batch_size=batch_size)
    out = []
    with torch.no_grad():
        for i in range(0, len(pert), batch_size):
            chunk = pert[i:i + batch_size]
            out.append(t.model(t.strategy, build_ctx(t.strategy, chunk),
                               dual=t.dual).float().cpu())
    return torch.cat(out).detach()


def loss_fall(losses: list[float], window: int = 10) -> tuple[float, float]:
    """(mean loss of the first ``window`` steps, of the last ``window``): how far training
    brought it."""
    if not losses:
        raise ValueError("'losses' must hold at least one value")
    w = max(1, min(window, len(losses) // 4 or 1))
    return sum(losses[:w]) / w, sum(losses[-w:]) / w


def train_both(params: dict, graph, device: torch.device, middle: str = "delta"
               ) -> tuple[dict, dict, int, torch.Tensor]:
    """Train both pipelines ``warmup + adopt_steps`` steps, interleaved, on the teacher's
    labels; returns ``(arm results, losses, batch size, labels)``. ``middle``: the fix's form
    (``delta`` or ``full``, see :class:`~workbook_lib.strategies.node_mask_shared.NodeMaskShared`)."""
    b = params["batch_size_lazy"]
    steps, warm = params["adopt_steps"], params["warmup"]
    arms = []
    # the same samples, in the same order, for both, labelled by the teacher
    pert = sample_perturbations(graph.num_genes, params["perturbation_k"], (steps + warm) * b,
                                seed=params["seed"])
    labels = teacher_labels(params, graph, device, pert, b)
    for key, (name, form) in PIPELINES.items():
        pipe = build_pipeline(params, name, graph, device, batch_size=b, form=form, pert=pert,
                              labels=labels,
                              middle=middle if name == "node_mask_shared" else None)
        trainable = [p for p in pipe.model.parameters() if p.requires_grad]
        opt = (torch.optim.SGD(trainable, lr=params["adopt_lr"])
               if params["adopt_optimizer"] == "sgd" else
               torch.optim.AdamW(trainable, lr=params["adopt_lr"]))
        arm = loop.Arm(key, pipe, loop.make_loader(pipe), loop.Variant(key, "full"),
                       optimizer=opt)
        arm.record_losses = True
        arms.append(arm)
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
    return res, losses, b, labels


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
            labels: torch.Tensor, memory=None, ddp=None, graph=None) -> AdoptionResult:
    """The two trainings side by side. ``labels``: those the pipelines trained on (their largest
    absolute value bounds the predictions, see :func:`implied_prediction_diff`)."""
    from ..training.loop import project_epochs

    rep, fix = losses["replicated"], losses["fix"]
    # the predictions' relative difference the two MSE curves imply, at least (module docstring)
    rel = implied_prediction_diff(rep, fix, float(labels.abs().max()))
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
    from .. import pipelines


    return AdoptionResult(steps=params["adopt_steps"], warmup_steps=params["warmup"],
                          batch_size=batch_size, lr=params["adopt_lr"],
                          optimizer=params["adopt_optimizer"], losses=losses,
                          rel_diff=rel, max_rel_diff=max(rel), step=step, speedup=speed,
                          memory_per_sample=mem, epochs_per_day=epochs, projection_basis=basis,
                          device=device_label,
                          **dict(zip(("tolerance", "tolerance_basis"),
                                     loss_tolerance(device_label, graph, params["layers"]))),
                          labels={k: pipelines.label(n) + (" (the Lazy model's form)"
                                                          if k == "replicated" else "")
                                  for k, (n, _f) in PIPELINES.items()},
                          label_variance=float(labels.var()))
