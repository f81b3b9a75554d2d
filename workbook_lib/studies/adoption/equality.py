"""Whether a rewrite computes the same as the pipeline it replaces (``python -m workbook_lib
equal SLOW FAST``; notebook 06 runs the same check before it trains).

The steps of :func:`check_pipelines`: (1) build both pipelines from one seed; (2) pair their
parameters by name (:class:`ParameterMismatchError`); (3) copy the slow model's parameters and
buffers into the fast one; (4) switch off dropout modules; (5) run the same batches through both
in float64 (float32 where a pipeline cannot, saying why); (6) rerun the slow one with another seed
(:class:`StochasticPipelineError` if it changes); (7) compare the outputs, the loss and every
gradient. A tensor is equal when ``max|fast - slow| <= max(tol * size, max|probe - slow|)``,
``probe`` being the slow pipeline rerun with rounding injected (docs/own-pipeline.md, "The rule").

Written here rather than with ``torch.testing.assert_close``: that raises on the first tensor
with an element-wise ``atol + rtol * |expected|`` rule, where this must report every tensor of the
pair in one table, against a tolerance that follows the rounding of each tensor's own terms.
"""
from __future__ import annotations

import torch

from ...configs.validation import Params
from ...failures import describe_exception
from ...exceptions import PipelineError, WorkbookError
from ...results.adoption import EqualityResult, TensorDiff
from .parameters import copy_parameters, parameter_mapping
from .seeded_runs import _ModelState, _Run, _compare, _run, dropout_modules


# ------------------------------------------------------------------ the check
class StochasticPipelineError(WorkbookError, ValueError):
    """A pipeline's outputs change between two runs on the same batch with its dropout modules
    off (functional dropout, ``dropout_edge``, noise), so a difference could be a draw (exit 2).

    Attributes:
        side: ``slow`` or ``fast``.
        pipeline: its name.
        row: the tensor that changed most between the two runs.
    """

    def __init__(self, message: str, *, side: str, pipeline: str, row: "TensorDiff"):
        super().__init__(message)
        self.side, self.pipeline, self.row = side, pipeline, row


def _refuse_stochastic(pipe, side: str, seed: int, rows: list[TensorDiff], mode: str) -> None:
    """Raise :class:`StochasticPipelineError` when a row of the two seeds' runs differs."""
    bad = [r for r in rows if not r.equal]
    if not bad:
        return
    w = max(bad, key=lambda r: r.ratio)
    how = "in eval mode" if mode == "eval" else "with dropout modules off"
    raise StochasticPipelineError(
        f"'{pipe.name}' ({side}) is still random {how}: seeds {seed} and {seed + 1} give "
        f"another {w.name} ({w.rel_diff:.1e} of its size), so a difference could be a draw. "
        "Make it follow the module's training flag (F.dropout, dropout_edge: "
        "training=self.training) and pass --eval",
        side=side, pipeline=pipe.name, row=w)


class CheckStalled(PipelineError):
    """A pipeline's batch made no progress within ``stall_timeout_s`` during the check."""


def _watched(name: str, what: str, stall_timeout_s: float | None, fn):
    """``fn()`` with ``what`` watched for ``stall_timeout_s`` (None or 0: not watched);
    :class:`CheckStalled` naming the pipeline where it makes no progress."""
    if not stall_timeout_s:
        return fn()
    from ...common.watchdog import Stalled, Watchdog

    try:
        with Watchdog(why="stall_timeout_s") as wd, \
                wd.watch(f"pipeline '{name}'", what, stall_timeout_s):
            return fn()
    except Stalled as exc:
        raise CheckStalled(name, f"{what} made no progress for {exc.waited_s:.0f} s "
                                 "(stall_timeout_s): it blocks") from None


def _try_float64(run, pipes: dict, seed: int) -> tuple[torch.dtype, dict, str]:
    """Batch 0 of both sides in float64 under the dtype guard: ``(float64, {side: run}, "")``
    where both ran in it, else ``(float32, {}, why)``."""
    first = {}
    for side in ("slow", "fast"):
        name = pipes[side].name
        try:
            r = run(side, 0, seed, torch.float64, guard=True)
        except CheckStalled:  # blocking is no dtype's fault: not waited on twice (a review)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: float32, and said why
            return torch.float32, {}, f"float64 could not run: '{name}' raised {describe_exception(exc, 160)}"
        if r.off_dtype:
            return torch.float32, {}, (f"float64 could not run: '{name}' computes in another "
                                       f"dtype ({r.off_dtype})")
        first[side] = r
    return torch.float64, first, ""


def _rule(dtype: torch.dtype, tolerance: float, tolerance_basis: str,
          tolerance64: float | None, seed: int):
    """``(tol, its basis, the probe in words, probe factory model -> context)`` of the rule in
    ``dtype`` (module docstring)."""
    from ...measurement.precision import (FLOAT64_TOLERANCE, ROUNDING_MODEL_EPS, rounding_model,
                                          rounding_probe)

    if dtype == torch.float64:
        tol = FLOAT64_TOLERANCE if tolerance64 is None else tolerance64
        basis = (f"float64, {tol:.0e}: about 10^7 times float64's rounding (2.2e-16) and 10^6 "
                 "times smaller than the 0.2% difference it must catch" if tolerance64 is None
                 else f"given ({tol:.0e})")
        return (tol, basis, f"every module's output rounded at relative size {tol:.0e}",
                lambda model: rounding_probe(model, tol, seed=seed))
    rel = ROUNDING_MODEL_EPS * torch.finfo(torch.float32).eps
    return (tolerance, tolerance_basis,
            f"every operation's result rounded at {ROUNDING_MODEL_EPS} float32 eps ({rel:.1e}), "
            "a sum's by sqrt(terms) x the sum of its terms' magnitudes",
            lambda model: rounding_model(rel, seed=seed))


def _in_converted(model: torch.nn.Module) -> str:
    """What the probe does in a converted encoder, where ``model`` holds one: its output and the
    modules its plan calls are rounded, the others it does not run (their hooks pass unused:
    :mod:`workbook_lib.common.probes`); else ""."""
    from ...nodemask.convert import ConvertedEncoder

    held = any(isinstance(m, ConvertedEncoder) for m in model.modules())
    return " (in a converted encoder: its output and the modules its plan calls)" if held else ""


def check_pipelines(slow, fast, *, tolerance: float, tolerance_basis: str, seed: int = 0,
                    renames: dict[str, str] | None = None, batches: int = 1,
                    batch_size: int | None = None, precision: str = "float64",
                    mode: str = "train", tolerance64: float | None = None,
                    stall_timeout_s: float | None = None) -> EqualityResult:
    """Steps 2-7 of the module docstring on two built pipelines (the fast model's parameters are
    overwritten with the slow model's; both models are otherwise restored, gradients cleared).
    ``stall_timeout_s``: each batch of each side may make no progress this long, else a
    ``PipelineError`` names it (a dataset that blocks: found by CI, 06's check waited on one
    for an hour).

    Args:
        slow, fast: the reference pipeline and the rewrite.
        tolerance: the rule's relative tolerance in float32; tolerance_basis: how it was derived.
        seed: the RNG seed set before each forward (the randomness check uses ``seed + 1``).
        renames: slow name (or prefix) -> fast name, see :func:`parameter_mapping`.
        batches: how many batches to compare; batch_size: default the slow pipeline's.
        precision: ``float64`` (float32 fallback, said why) or ``float32``.
        mode: ``train`` (every module but dropout in training mode) or ``eval``.
        tolerance64: the relative tolerance in float64 (default ``FLOAT64_TOLERANCE``).

    Raises:
        ParameterMismatchError, StochasticPipelineError; ValueError for invalid arguments or a
        dataset too small.
    """
    b = batch_size or slow.batch_size
    if not isinstance(batches, int) or batches <= 0:
        raise ValueError(f"'batches' must be a positive integer (got {batches!r})")
    if not isinstance(b, int) or b <= 0:
        raise ValueError(f"'batch_size' must be a positive integer (got {b!r})")
    if precision not in ("float64", "float32"):
        raise ValueError(f"'precision' must be 'float64' or 'float32' (got {precision!r})")
    if mode not in ("train", "eval"):
        raise ValueError(f"'mode' must be 'train' or 'eval' (got {mode!r})")
    if not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
    if tolerance64 is not None and not tolerance64 > 0:
        raise ValueError(f"'tolerance64' must be > 0 (got {tolerance64})")
    for p in (slow, fast):
        n = _watched(p.name, "len(dataset())", stall_timeout_s, lambda p=p: len(p.dataset()))
        if n < batches * b:
            raise ValueError(f"the dataset of '{p.name}' holds {n} items, fewer than {batches} "
                             f"batch(es) of {b}")
    mapping = parameter_mapping(slow.model, fast.model, renames, slow_label=slow.name,
                                fast_label=fast.name)
    copied, not_copied = copy_parameters(slow.model, fast.model, mapping)
    states = {"slow": _ModelState(slow.model), "fast": _ModelState(fast.model)}
    pipes = {"slow": slow, "fast": fast}
    dropout_off = {side: dropout_modules(p.model) for side, p in pipes.items()}

    def run(side: str, i: int, s: int, dtype: torch.dtype, **kw) -> _Run:
        return _watched(pipes[side].name, f"the check's batch {i}", stall_timeout_s,
                        lambda: _run(pipes[side], states[side], i, b, s, dtype=dtype,
                                     mode=mode, **kw))

    dtype, first, note = torch.float32, {}, ""
    if precision == "float64":
        dtype, first, note = _try_float64(run, pipes, seed)
    tol, basis, probe_text, probe = _rule(dtype, tolerance, tolerance_basis, tolerance64, seed)
    if dtype == torch.float64:
        probe_text += _in_converted(slow.model)
    worst: dict[str, TensorDiff] = {}

    def keep(row: TensorDiff) -> None:
        old = worst.get(row.name)
        if old is None or (not row.equal and old.equal) or (
                row.equal == old.equal and row.ratio > old.ratio):
            worst[row.name] = row

    fast_checked = False
    for i in range(batches):
        a = first.get("slow") if i == 0 else None
        a = a or run("slow", i, seed, dtype)
        if i == 0:  # randomness left with dropout off: the same batch, another seed
            again = run("slow", 0, seed + 1, dtype)
            _refuse_stochastic(slow, "slow", seed, _compare(a, again, None, tol), mode)
        pr = run("slow", i, seed, dtype, probe=probe)
        f = (first.get("fast") if i == 0 else None) or run("fast", i, seed, dtype)
        rows = _compare(a, f, mapping, tol, probe=pr)
        if not fast_checked and not all(r.equal for r in rows):
            fast_checked = True
            again = run("fast", i, seed + 1, dtype)
            _refuse_stochastic(fast, "fast", seed, _compare(f, again, None, tol), mode)
        for row in rows:
            keep(row)
    randomness = (f"none left: the slow pipeline's outputs and loss are the same with seeds "
                  f"{seed} and {seed + 1}" + (", and the fast pipeline's" if fast_checked
                                              else ""))
    return EqualityResult(slow=slow.name, fast=fast.name, tolerance=tol,
                          tolerance_basis=basis, batch_size=b, batches=batches,
                          renames=dict(renames or {}), rows=list(worst.values()),
                          buffers_copied=copied, buffers_not_copied=not_copied,
                          device=str(torch.device(fast.device)),
                          precision="float64" if dtype == torch.float64 else "float32",
                          precision_note=note, probe=probe_text, mode=mode,
                          dropout_off=dropout_off, randomness=randomness)


def equality_tolerance(graph, layers: int) -> tuple[float, str]:
    """The rule's tolerance for ``graph`` and ``layers`` and its basis in words."""
    from ...measurement.precision import float32_tolerance

    tol = float32_tolerance(graph, layers)
    return tol, (f"float32 sums in another order: 32 x eps x sqrt(largest in-degree) x "
                 f"{layers} layers, at least 2e-5 ({tol:.1e})")


def seeded_build(params: Params, name: str, graph, device, **kw):
    """:func:`workbook_lib.pipelines.build_pipeline` with torch's (and Python's and numpy's)
    RNG set to ``params.seed`` first, so that two pipelines start from the same draws."""
    import random

    import numpy as np

    from ...pipelines import build_pipeline

    random.seed(params.seed)
    np.random.seed(params.seed % 2 ** 32)
    torch.manual_seed(params.seed)
    return build_pipeline(params, name, graph, device, **kw)


def check_equal(params: Params, slow: str, fast: str, graph, device, *,
                renames: dict[str, str] | None = None, batches: int = 1,
                batch_size: int | None = None, tolerance: float | None = None,
                precision: str = "float64", mode: str = "train") -> EqualityResult:
    """Build ``slow`` and ``fast`` (built-in strategies or ``params.pipelines`` entries) from the
    same seed and compare them with :func:`check_pipelines` (whose other arguments it passes on);
    ``tolerance`` defaults to ``FLOAT64_TOLERANCE`` in float64, :func:`equality_tolerance` in float32.
    """
    if slow == fast:
        raise ValueError(f"compare two different pipelines (got {slow!r} twice)")
    if tolerance is not None and not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0 (got {tolerance})")
    if tolerance is None:
        tol, basis = equality_tolerance(graph, params.layers)
    else:
        tol, basis = tolerance, f"given ({tolerance:.1e})"
    return compare_built(params, slow, fast, graph, device, tolerance=tol,
                         tolerance_basis=basis, renames=renames, batches=batches,
                         batch_size=batch_size, precision=precision, mode=mode,
                         tolerance64=tolerance)


def _built(params: Params, names: tuple[str, str], graph, device, dtype: torch.dtype) -> tuple:
    """Both pipelines, each from ``params.seed``, built with ``dtype`` as the default: what a
    pipeline computes when it is built (a normalised adjacency kept as a buffer) is then in
    that dtype, not float32 cast up (found by a user trial: such a rewrite was told DIFFERENT
    at 6.7e-8, float32's rounding, while the same rewrite built on its first forward was
    EQUAL)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:  # not run on a batch here: check_pipelines runs them, in float64 where they can
        return tuple(seeded_build(params, n, graph, device, check=dtype != torch.float64)
                     for n in names)
    finally:
        torch.set_default_dtype(default)


def compare_built(params: Params, slow: str, fast: str, graph, device, *, tolerance: float,
                  tolerance_basis: str, precision: str = "float64", **kw) -> EqualityResult:
    """:func:`check_pipelines` on ``slow`` and ``fast`` built for the compared dtype
    (:func:`_built`): in float64, and where float64 cannot run, built again in float32 and
    compared there, saying why."""
    def compare(dtype: torch.dtype, prec: str) -> EqualityResult:
        built = ""
        try:
            s, f = _built(params, (slow, fast), graph, device, dtype)
        except Exception as exc:  # noqa: BLE001 - one that cannot be built so: as before, in
            if dtype != torch.float64:  # float32 (check_pipelines converts it, or falls back)
                raise
            s, f = _built(params, (slow, fast), graph, device, torch.float32)
            built = (f"built in float32, then converted (building with float64 as the default "
                     f"raised {describe_exception(exc, 120)})")
        res = check_pipelines(s, f, tolerance=tolerance, tolerance_basis=tolerance_basis,
                              seed=params.seed, precision=prec,
                              stall_timeout_s=params.stall_timeout_s, **kw)
        if built:
            res.precision_note = "; ".join(x for x in (built, res.precision_note) if x)
        return res
    if precision != "float64":
        return compare(torch.float32, precision)
    res = compare(torch.float64, "float64")
    if res.precision == "float64":
        return res
    again = compare(torch.float32, "float32")  # float64 could not run: built in float32 again
    again.precision_note = res.precision_note
    return again
