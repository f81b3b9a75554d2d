"""Notebook 06: adopting the fix. The same model, from the same seed, trained on the same batches
with replicated masks and with the node-mask shared graph, steps interleaved in one process; the
loss curves must agree to float32 rounding, and time, memory and epochs per day are compared.

Labels come from a fixed teacher model, so the compared training is one that learns. With user
pipelines only, 06 trains the pair ``gap_strategies`` names and compares their losses directly.
Both pairs are first checked by :func:`~workbook_lib.studies.adoption.equality.check_pipelines`;
where no checked pair exists, 06 trains nothing and says why (``applicable`` False).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...configs.schema import AdoptSection, MeasureSection
from ...configs.validation import Params
from ...measurement.timing import Stat
from ...data.perturbations import sample_perturbations
from ...pipelines import build_pipeline, user_specs
from ...training import loop
from ...results.adoption import AdoptionResult, EqualityResult, finite_loss, loss_fall  # noqa: F401
from .fix_speedups import speedup_inputs, speedups  # noqa: F401 (the notebook's speedups table)
from .equality import check_pipelines, compare_built, equality_tolerance, seeded_build
from .parameters import ParameterMismatchError, copy_parameters, parameter_mapping

PIPELINES = {"replicated": ("replicated_mask_cpu", "gather_scatter"),
             "fix": ("node_mask_shared", "spmm")}


def implied_prediction_diff(rep: list[float], fix: list[float], label_max: float) -> list[float]:
    """Per step, the least relative RMS difference of the two pipelines' predictions that their MSE
    losses imply: ``|sqrt(f) - sqrt(r)| / (label_max + sqrt(max(r, f)))`` (a lower bound, by
    Minkowski's inequality; docs/development.md explains why losses are not compared directly).

    Args:
        rep, fix: the two pipelines' loss per step (mean squared error).
        label_max: the largest absolute label.
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


def teacher_labels(params: Params, graph, device: torch.device, pert: torch.Tensor,
                   batch_size: int) -> torch.Tensor:
    """Each sample's label from a fixed teacher (the same model from seed
    ``seed + TEACHER_SEED_OFFSET``, run exactly on the perturbed graph), on the host.

    Args:
        params, graph, device: the run's params, the cell graph, where the teacher runs.
        pert: ``[n, k]`` perturbations; batch_size: samples per teacher forward.
    """
    from ...strategies import build_ctx
    from ...training.factory import build_run

    t = build_run(params.replace(seed=params.seed + TEACHER_SEED_OFFSET), "node_mask_shared",
                  graph=graph, device=device, batch_size=batch_size)
    out = []
    with torch.no_grad():
        for i in range(0, len(pert), batch_size):
            chunk = pert[i:i + batch_size]
            out.append(t.model(t.strategy, build_ctx(t.strategy, chunk),
                               dual=t.dual).float().cpu())
    return torch.cat(out).detach()


@dataclass
class Pair:
    """The two pipelines 06 trains, checked.

    Attributes:
        mode: ``builtin`` or ``pipelines``.
        names, pipes: role key -> pipeline name, and -> built pipeline (empty when not applicable).
        equality: the check before training (None when it could not run).
        reason: why 06 does not apply (empty when it does).
        batch_size: samples per step; labels: the teacher's labels (built-in mode), else None.
    """

    mode: str
    names: dict
    pipes: dict
    equality: EqualityResult | None
    reason: str
    batch_size: int
    labels: torch.Tensor | None = None

    @property
    def applicable(self) -> bool:
        return not self.reason


def check_pair(params: Params, graph, device: torch.device, middle: str = "delta") -> Pair:
    """Build the pair 06 trains and check it computes the same (module docstring). ``middle``:
    the built-in fix's form (``delta`` or ``full``)."""
    tol, basis = equality_tolerance(graph, params.layers)
    if params.strategies:
        b = params.batch_size_lazy
        steps, warm = params.adopt_steps, params.warmup
        # the same samples, in the same order, for both, labelled by the teacher
        pert = sample_perturbations(graph.num_genes, params.perturbation_k,
                                    (steps + warm) * b, seed=params.seed)
        labels = teacher_labels(params, graph, device, pert, b)
        pipes = {key: build_pipeline(params, name, graph, device, batch_size=b, form=form,
                                     pert=pert, labels=labels,
                                     middle=middle if name == "node_mask_shared" else None)
                 for key, (name, form) in PIPELINES.items()}
        names = {k: n for k, (n, _f) in PIPELINES.items()}
        mode = "builtin"
    else:
        users = list(user_specs(params))
        if len(users) < 2:
            return Pair("pipelines", {}, {}, None, (
                "06 trains a slow pipeline beside its exact rewrite; this run names one "
                f"pipeline ({', '.join(repr(u) for u in users) or 'none'}) and no built-in "
                "strategy, so there is no pair to train"), 0)
        slow, fast = params.gap_strategies
        names = {slow: slow, fast: fast}
        mode, labels = "pipelines", None
        pipes = {n: seeded_build(params, n, graph, device) for n in (slow, fast)}
        if getattr(pipes[fast], "exact", None) is False:
            return Pair(mode, names, {}, None, (
                f"the fast pipeline of gap_strategies, '{fast}', is not exact (exact = False): "
                f"it computes another model than '{slow}', so their trainings cannot be the "
                "same; name an exact rewrite of it in gap_strategies to train the two side by "
                "side"), pipes[slow].batch_size)
        b = pipes[slow].batch_size
    rep, fix = pipes.values()
    try:
        # a user's pipelines checked as `equal` checks them: built again for float64 (the
        # trained ones stay float32-built; found by a review, 06 refused a rewrite that
        # keeps a constant as a buffer, which `equal` calls EQUAL)
        eq = compare_built(params, slow, fast, graph, device, tolerance=tol,
                           tolerance_basis=basis, batch_size=b) if mode == "pipelines" else \
            check_pipelines(rep, fix, tolerance=tol, tolerance_basis=basis,
                            seed=params.seed, batch_size=b)
        if mode == "pipelines":  # the trained pair starts from the same numbers, as the
            # check's copies did (check_pipelines copies into the pipelines it checks; a review)
            copy_parameters(rep.model, fix.model, parameter_mapping(
                rep.model, fix.model, None, slow_label=rep.name, fast_label=fix.name))
    except ParameterMismatchError as exc:
        return Pair(mode, names, {}, None, (
            f"the parameters of '{rep.name}' and '{fix.name}' do not pair, so they cannot "
            f"start from the same numbers ({exc})"), b, labels)
    except ValueError as exc:
        return Pair(mode, names, {}, None, f"the check before training could not run ({exc})",
                    b, labels)
    except Exception as exc:  # noqa: BLE001 - a user's pipeline failing: 06 does not apply
        if mode != "pipelines":
            raise  # a built-in strategy failing is a bug of this package
        msg = " ".join(str(exc).split())[:200]
        return Pair(mode, names, {}, None, (
            f"a pipeline failed in the check before training ({type(exc).__name__}: {msg}), so "
            "there is nothing to train side by side"), b, labels)
    if not eq.equal:
        return Pair(mode, names, {}, eq, (
            "the check before training found that they do not compute the same, so their "
            f"trainings cannot be compared: {eq.summary()}"), b, labels)
    return Pair(mode, names, pipes, eq, "", b, labels)


def train_pair(adopt: AdoptSection, measure: MeasureSection, pair: Pair,
               device: torch.device) -> tuple[dict, dict]:
    """Train both pipelines of ``pair`` ``warmup + adopt_steps`` steps, interleaved, on the same
    batches (each dataset in order); returns ``(arm results, losses per key)``.

    Args:
        adopt: ``params.adopt`` (steps, optimizer, learning rate).
        measure: ``params.measure`` (warm-up steps, stall timeout).
    """
    if not pair.applicable:
        raise ValueError(f"06 does not apply: {pair.reason}")
    steps, warm = adopt.adopt_steps, measure.warmup
    arms = []
    for key, pipe in pair.pipes.items():
        trainable = [p for p in pipe.model.parameters() if p.requires_grad]
        opt = (torch.optim.SGD(trainable, lr=adopt.adopt_lr)
               if adopt.adopt_optimizer == "sgd" else
               torch.optim.AdamW(trainable, lr=adopt.adopt_lr))
        arm = loop.Arm(key, pipe, loop.make_loader(pipe, pair.batch_size),
                       loop.Variant(key, "full"), optimizer=opt)
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
                            budget_s=float("inf"), count_syncs=False, desc="06 training",
                            stall_timeout_s=measure.stall_timeout_s, notebook="06")
    finally:
        if cuda:
            torch.use_deterministic_algorithms(was)
    return res, {a.name: [float(x) for x in a.losses] for a in arms}


def relative_loss_diff(ref: list[float], other: list[float]) -> list[float]:
    """Per step, ``|other - ref| / max(|ref|, |other|)`` (0 where both are 0).

    Args:
        ref: the reference pipeline's loss per step.
        other: the other pipeline's, the same steps.
    """
    if len(ref) != len(other):
        raise ValueError(f"the loss curves must have equal length (got {len(ref)} and "
                         f"{len(other)})")
    out = []
    for r, o in zip(ref, other):
        scale = max(abs(r), abs(o))
        out.append(abs(o - r) / scale if scale > 0 else 0.0)
    return out


def not_applicable(adopt: AdoptSection, pair: Pair, device_label: str) -> AdoptionResult:
    """06's result when it does not apply (nothing trained; ``adopt``: ``params.adopt``): the
    reason, and the check when it ran."""
    return AdoptionResult(steps=0, warmup_steps=0, batch_size=pair.batch_size,
                          lr=adopt.adopt_lr, optimizer=adopt.adopt_optimizer, losses={},
                          rel_diff=[], max_rel_diff=float("nan"), step={}, speedup=None,
                          device=device_label, mode=pair.mode, names=dict(pair.names),
                          labels={k: _label(n) for k, n in pair.names.items()},
                          applicable=False, reason=pair.reason, equality=pair.equality,
                          rule="")


def _form_label(key: str, pair: Pair | None, layers: int) -> str:
    """What a built-in arm's label adds: the Lazy model's form, or the path the fix's step took
    at this depth (delta and its push kernel, full middle layers, or plain below 3 layers)."""
    if key == "replicated":
        return " (the Lazy model's form)"
    strategy = getattr((pair.pipes if pair is not None else {}).get(key), "strategy", None)
    path = getattr(strategy, "path_label", None)
    return f" ({path(layers)})" if path is not None else ""


def _label(name: str) -> str:
    from ... import pipelines

    return pipelines.label(name)


def adopt(params: Params, pair: Pair, device: torch.device, device_label: str, *, memory=None,
          ddp=None, graph=None) -> AdoptionResult:
    """Train the checked pair and compare the trainings (:func:`train_pair`, :func:`compare`);
    the not-applicable result when the pair does not apply."""
    from ...failures import PipelineFailed

    if not pair.applicable:
        return not_applicable(params.adopt, pair, device_label)
    try:
        res, losses = train_pair(params.adopt, params.measure, pair, device)
    except PipelineFailed as exc:  # one of the two failed or stalled: nothing to compare
        pair.reason = f"the training stopped: {exc.failure.line()}"
        return not_applicable(params.adopt, pair, device_label)
    return compare(params, res, losses, pair.batch_size, device_label, labels=pair.labels,
                   memory=memory, ddp=ddp, graph=graph, pair=pair)


def loss_tolerance(device_label: str, graph=None, layers: int = 1) -> tuple[float, str]:
    """How close the two loss curves must be to count as the same training: 1e-5 (float32
    rounding) on a CPU, whose sums run in a fixed order; on CUDA, whose atomic sums do not, the
    float32 accumulation bound for this graph (:mod:`workbook_lib.measurement.precision`) when it
    is larger."""
    if device_label.startswith("cuda") and graph is not None:
        from ...measurement.precision import float32_tolerance

        tol = float32_tolerance(graph, layers, floor=1e-5)
        return tol, (f"float32 accumulation in any order on CUDA ({tol:.1e}: eps x sqrt(in-degree)"
                     f" x {layers} layers, with margin)")
    return 1e-5, "float32 rounding (1e-5)"


def compare(params: Params, res: dict, losses: dict, batch_size: int, device_label: str, *,
            labels: torch.Tensor | None, memory=None, ddp=None, graph=None,
            pair: Pair | None = None) -> AdoptionResult:
    """The two trainings side by side. ``labels``: those the built-in pipelines trained on
    (their largest absolute value bounds the predictions, see :func:`implied_prediction_diff`);
    ``pair``: the checked pair (default: the built-in one, unchecked)."""
    from ...training.loop import project_epochs

    names = pair.names if pair is not None else {k: n for k, (n, _f) in PIPELINES.items()}
    mode = pair.mode if pair is not None else "builtin"
    k_rep, k_fix = names
    # a loss that is not finite: the trainings diverged there, and nothing after it compares
    # (found by a user trial: NaN losses on both sides read as a 0 difference, 'same training')
    bad = [i for i, (a, b) in enumerate(zip(losses[k_rep], losses[k_fix]))
           if not (finite_loss(a) and finite_loss(b))]
    cut = bad[0] if bad else len(losses[k_rep])
    nonfinite = [names[k] for k in (k_rep, k_fix) if not all(map(finite_loss, losses[k]))]
    rep, fix = losses[k_rep][:cut], losses[k_fix][:cut]
    if mode == "builtin":
        # the predictions' relative difference the two MSE curves imply, at least (docstring)
        rel = implied_prediction_diff(rep, fix, float(labels.abs().max()))
        tol, tol_basis = loss_tolerance(device_label, graph, params.layers)
        rule = "the least relative RMS difference of the predictions the MSE losses imply"
    else:
        rel = relative_loss_diff(rep, fix)
        tol, tol_basis = equality_tolerance(graph, params.layers) if graph is not None \
            else (2e-5, "float32 rounding (2e-5)")
        if graph is not None:  # the run's snapshot and layers: the pipelines' own may differ
            tol_basis += ("; computed from this run's snapshot graph and its 'layers', not "
                          "from the pipelines' own models")
        rule = "the losses' own relative difference"
    step = {k: res[k].step for k in names}
    n = min(step[k_rep].n, step[k_fix].n)
    speed = Stat.from_samples([a / b for a, b in zip(step[k_rep].samples[:n],
                                                     step[k_fix].samples[:n])], unit="ratio",
                              target=step[k_rep].target).with_cpu(
        getattr(step[k_rep], "cpu", None), getattr(step[k_fix], "cpu", None))  # found by a trial
    mem = {}
    if memory is not None:
        per = memory.per_sample()
        for key, name in names.items():
            if name in per:
                mem[key] = per[name]
    epochs, basis = {}, f"80% of {params.num_samples:,} samples per epoch, 1 rank"
    factors, top, base = {}, 1, 1
    if ddp is not None and len(ddp.worlds) > 1:
        top, base = max(ddp.worlds), min(ddp.worlds)
        factors = getattr(ddp.gap, "step_factors", {}) or {}
        basis += (f"; {top} ranks: {top / base:g}x the samples per step at each pipeline's own "
                  "step factor measured in notebook 04 (none where 04 did not run it)")
    for key, st in step.items():
        one = project_epochs(st.median, batch_size, params.num_samples)["epochs_per_day"]
        epochs[key] = {"1 rank": one}
        name = names[key]
        if name in factors:
            epochs[key][f"{top} ranks"] = one * (top / base) / factors[name].median
    return AdoptionResult(steps=params.adopt_steps, warmup_steps=params.warmup,
                          batch_size=batch_size, lr=params.adopt_lr,
                          optimizer=params.adopt_optimizer,
                          losses={k: losses[k] for k in names},
                          rel_diff=rel, max_rel_diff=max(rel, default=0.0), step=step,
                          speedup=speed, nonfinite_step=bad[0] if bad else None,
                          nonfinite=nonfinite,
                          memory_per_sample=mem, epochs_per_day=epochs, projection_basis=basis,
                          device=device_label, tolerance=tol, tolerance_basis=tol_basis,
                          labels={k: _label(n) + _form_label(k, pair, params.layers)
                                  for k, n in names.items()},
                          label_variance=float(labels.var()) if labels is not None else None,
                          mode=mode, names=dict(names),
                          equality=pair.equality if pair is not None else None, rule=rule)
