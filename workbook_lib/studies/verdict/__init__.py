"""Notebook 05: why the slow pipeline is slow, and the fix, from what notebooks 01-04 measured.

Returns figures, not text (:mod:`workbook_lib.report.verdict_view` composes it): the gap between
the pair ``gap_strategies`` (from 03, times 04's DDP factor when that is a measured effect), its
causes stage by stage (:mod:`.causes`), the figures it does not rest on (disturbed or contended),
the claims (:mod:`.claims`, only when built-in strategies ran) and the fix (:mod:`.recommend`).
What it could not use, and why, is named in caveats. Rules: docs/development.md.
"""
from __future__ import annotations

from pathlib import Path

from ...configs.schema import defaults
from ...configs.validation import Params
from ...records import to_json
from ...catalog import notebook_info
from ...exceptions import IncompleteInputsError
from ...results.cpu import CpuShare
from ...measurement.timing import Stat
from ...running.results import file_checksum, load_result, params_differ, read_meta, results_path
from ... import pipelines
from ...results.verdict import Cause, Claim, Gap, Recommendation, VerdictResult  # noqa: F401
from . import claims as claims_mod
from ..timing import DANGO, LAZY, is_exact
# the parts, and the names the view and the tests read here
from .advice import NODEMASK, STATIC, SYNC_ADVICE  # noqa: F401
from .causes import (first_causes, offsets, rank_causes,  # noqa: F401
                     syncs_note, told_apart, gc_note)
from .gap import MIN_PAIRED, measure_gap, resolved  # noqa: F401
from .answer import CONTENDED_LABELS, DISTURBED_LABELS, compose  # noqa: F401
from .recommend import _bench, recommend
from ...results.bench import recommended_form
from ..adoption import proofs

TIMING = "03_data_vs_model_timing"
REQUIRED = notebook_info("05_verdict").requires  # notebook 03
OPTIONAL = notebook_info("05_verdict").reads  # 01, 02, 04


# ---------------------------------------------------------------------------------------------
# inputs


def load_inputs(run_dir: str | Path, params: Params | None = None
                ) -> tuple[dict, dict[str, str], dict[str, str]]:
    """The typed results of notebook 03 (required) and of 01, 02, 04 (when complete with the same
    result-relevant params), their checksums, and why each optional one was not used.

    Raises:
        IncompleteInputsError: notebook 03 is missing, incomplete, unreadable or of other params.
    """
    found, sums, why_not = {}, {}, {}
    for nb in REQUIRED + OPTIONAL:
        meta = read_meta(run_dir, nb)
        reason = ""
        if meta is None:
            reason = notebook_error(run_dir, nb) or "not run"
        elif not meta.complete:
            reason = "failed or incomplete" + (f" ({meta.incomplete_because})"
                                               if getattr(meta, "incomplete_because", "") else "")
        elif params is not None and params_differ(meta.params, params):
            reason = f"made with other params ({', '.join(params_differ(meta.params, params)[:3])})"
        res = None if reason else load_result(run_dir, nb)
        if res is None and not reason:
            reason = "its results are unreadable"
        if reason:
            why_not[nb] = reason
            continue
        found[nb] = res
        sums[nb] = file_checksum(results_path(run_dir, nb))
    bench = Path(run_dir) / "bench.json"  # quoted when present: --resume reruns when it changes
    if bench.is_file():
        sums["bench"] = file_checksum(bench)
    missing = [nb for nb in REQUIRED if nb in why_not]
    if missing:
        raise IncompleteInputsError(
            f"the verdict needs notebook 03's timings in {run_dir} ({TIMING}: "
            f"{why_not[TIMING]}); run it first with these params: "
            f"{run_command(run_dir, params)}", missing=missing,
            reasons={nb: why_not[nb] for nb in missing})
    return found, sums, why_not


def run_command(run_dir: str | Path, params: Params | None) -> str:
    """``python -m workbook_lib run --only 03 --out RUN --set K=V ...``: notebook 03 with the
    keys of ``params`` that differ from the defaults (found by a user trial: the hint ran the
    built-in strategies in place of the user's pair)."""
    import shlex

    parts = ["python", "-m", "workbook_lib", "run", "--only", "03", "--out", str(run_dir)]
    return shlex.join(parts + (set_args(params) if params is not None else []))


def set_args(params: Params) -> list[str]:
    """``--set K=V`` for each key of ``params`` that differs from the defaults."""
    import json

    base, given, out = defaults(), to_json(params), []
    for k, v in given.items():
        if k in base and v != to_json(base[k]):
            out += ["--set", f"{k}={json.dumps(v)}"]
    return out


def params_args(params: Params, run_dir: str | Path) -> str:
    """What a command needs to run with ``params``: ``--params RUN/params-<hash>.yaml`` where
    the run folder holds them (:func:`~workbook_lib.configs.validation.params_file_name`: named
    by its content, never rewritten with other values), else their ``--set`` keys (found by a
    user trial: 05's `equal` command had none, and `equal` then built the pair on the default
    params' graph, not the one measured)."""
    import shlex

    from ...configs.validation import params_file_name, same_params

    path = Path(run_dir) / params_file_name(params)
    if same_params(path, params):
        return shlex.join(["--params", str(path)])
    return shlex.join(set_args(params))


def notebook_error(run_dir: str | Path, nb: str) -> str:
    """"failed: ERROR" from the partial notebook a failed run left in the run folder (the
    failing cell's error, one line), or ""."""
    import json

    path = Path(run_dir) / f"{nb}.ipynb"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    for cell in doc.get("cells", []):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                text = " ".join(f"{out.get('ename', '')}: {out.get('evalue', '')}".split())
                return "failed: " + (text if len(text) <= 200 else text[:197] + "...")
    return ""


# ---------------------------------------------------------------------------------------------
# what a CPU run can and cannot tell (the gap: ``gap``, its causes: ``causes``, the fix:
# ``recommend``)


CPU_CAN = ["exactness of every strategy (outputs and gradients)",
           "sizes: masks, replicated edge indices, caches, what a batch carries",
           "how the strategies' compute compares (graph passes per sample, message forms)",
           "how many host syncs each pipeline makes",
           "peak memory per sample of each strategy (host memory)"]
CPU_CANNOT = ["host-to-device transfer costs (a CPU run copies nothing)",
              "what each sync costs (a CPU never waits for a device)",
              "GPU kernel efficiency and GPU memory limits",
              "NCCL communication between GPUs"]


def _headline_stats(gap: Gap | None, rec: Recommendation | None) -> dict[str, Stat | None]:
    figs: dict[str, Stat | None] = {}
    if gap is not None:
        figs.update(gap=gap.ratio, per_step_ratio=gap.per_step)
        if gap.ddp_factor is not None:
            figs["ddp_factor"] = gap.ddp_factor
    if rec is not None:
        figs["speedup"] = rec.speedup
        figs["bench"] = rec.bench.ratio_vs_lazy_form if rec.bench is not None else None
    return figs


def disturbed_figures(gap: Gap | None, rec: Recommendation | None,
                      target: float) -> dict[str, float]:
    """The headline figures whose median is not known to ``target`` (:meth:`Stat.known_to`:
    the half-width of its 95% confidence interval beyond it): key -> that half-width over the
    median. A figure whose steps vary but were measured long enough is not disturbed."""
    return {k: st.ci_half_width() for k, st in _headline_stats(gap, rec).items()
            if st is not None and st.n > 1 and not st.known_to(target)}


def contended_figures(gap: Gap | None, rec: Recommendation | None,
                      timing=None, exact: set[str] | None = None) -> dict[str, CpuShare]:
    """The headline figures measured while the process got less CPU than its threads asked for
    (:attr:`Stat.contended`), and notebook 03's steps the fix is chosen by (the recommendation's
    ``step_mode``) when any exact strategy's was: key ->
    the CPU share it was measured with."""
    out = {k: st.cpu for k, st in _headline_stats(gap, rec).items()
           if st is not None and getattr(st, "contended", False)}
    if timing is not None:
        lo = timing.loops
        mode = rec.step_mode if rec is not None else "full"  # the steps the fix is chosen by
        arms = [lo.arm(n, mode).step for n in lo.strategies
                if (n in exact if exact is not None else is_exact(lo, n))]
        bad = [a.cpu for a in arms if getattr(a, "contended", False)]
        if bad:
            out["loop"] = min(bad, key=lambda c: c.judged)
    return out


def kernel_bound_steps(lo, names: list[str]) -> dict[str, CpuShare]:
    """Pipeline -> its full step's CPU share, for each of ``names`` (the pair) whose full step
    in notebook 03 was kernel-bound (:attr:`CpuShare.kernel_bound`: much of its time the
    operating system faulting freed memory back in, not its own work)."""
    out = {}
    for n in names:
        cpu = getattr(lo.arm(n, "full").step, "cpu", None) if _in_timing(lo, n) else None
        if cpu is not None and cpu.kernel_bound:
            out[n] = cpu
    return out


# ---------------------------------------------------------------------------------------------
# what went wrong in the user's pipelines


def pipeline_failures(found: dict) -> dict[str, str]:
    """pipeline -> "NB: what failed" for every pipeline a notebook lost (one line each; a loss
    that was not finite is :func:`nonfinite_losses`'s)."""
    from ...failures import NONFINITE

    out: dict[str, str] = {}
    for nb, res in sorted(found.items()):
        groups = [getattr(res, "failures", None),
                  getattr(getattr(res, "loops", None), "failures", None),
                  getattr(getattr(res, "memory", None), "failures", None)]
        for g in groups:
            for name, f in (g or {}).items():
                if getattr(f, "kind", "") != NONFINITE:
                    out.setdefault(name, f"in notebook {nb[:2]}: {f.line()}")
    return out


def nonfinite_losses(lo) -> dict[str, str]:
    """pipeline -> its loss in words, for pipelines whose full step's loss was not finite."""
    out = {}
    for n in lo.strategies:
        try:
            a = lo.arm(n, "full")
        except KeyError:
            continue
        bad = getattr(a, "nonfinite_steps", 0) or 0
        if bad:
            first = getattr(a, "first_nonfinite_step", None)
            out[n] = (f"its loss was not finite in {bad} of its steps"
                      + (f" from step {first}" if first is not None else ""))
    return out


def _in_timing(lo, name: str) -> bool:
    try:
        lo.arm(name, "full")
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------------------------------------
# the verdict


def build_verdict(found: dict, inputs: dict[str, str], params: Params, run_dir: Path,
                  device: str, device_type: str,
                  missing: dict[str, str] | None = None) -> VerdictResult:
    """Everything notebook 05 says, as figures (its text: the view).

    Args:
        found: the typed results :func:`load_inputs` read (03 always; 01, 02, 04 when usable).
        missing: notebook -> why it was not used (from :func:`load_inputs`).
    """
    missing = dict(missing or {})
    inv = found.get("01_graph_inventory")
    mc = found.get("02_mask_cost_model")
    timing = found[TIMING]
    ddp = found.get("04_ddp_scaling")
    lo = timing.loops
    listed = list(params.gap_strategies)
    builtin = bool(params.strategies)
    failures = pipeline_failures(found)
    nonfinite = nonfinite_losses(lo)
    res = VerdictResult(answer="", device=device, device_type=device_type, causes=[],
                        claims=[], recommendation=None, gap_total=None,
                        can_say=CPU_CAN if device_type != "cuda" else [],
                        cannot_say=CPU_CANNOT if device_type != "cuda" else [], inputs=inputs,
                        target=params.precision_target, gap_strategies=listed,
                        missing=missing, failures=failures, nonfinite=nonfinite,
                        builtin=builtin, num_samples=int(params.num_samples),
                        specs={n: s.target for n, s in pipelines.user_specs(params).items()},
                        params_args=params_args(params, run_dir))
    absent = [n for n in listed if not _in_timing(lo, n)]
    if absent:
        n = absent[0]
        why = failures[n].split(": ", 1)[1] if n in failures else f"'{n}' was not timed"
        res.no_answer = (f"no answer about '{listed[0]}' against '{listed[1]}': notebook 03 has "
                         f"no full step of '{n}': {why}")
    else:
        g = measure_gap(lo, *listed, params.num_samples, ddp, params.precision_target)
        res.gap, res.gap_total, res.gap_strategies = g, g.ratio, [g.slow, g.fast]
        res.causes = rank_causes(timing, g.slow, g.fast, g, device_type)
        res.syncs_note = syncs_note(res.causes, device_type)
        res.gc_note = gc_note(lo, g.slow, g.fast)
    res.claims, res.claims_note = judge_claims(inv, mc, timing, ddp, params, run_dir,
                                               device_type)
    res.exactness, proven, differ = exactness(lo, params,
                                              res.gap_strategies if res.gap else [])
    exact = ({n for n in lo.strategies if is_exact(lo, n)} - differ) | proven
    res.recommendation = recommend(
        timing, mc, ddp, run_dir, baseline=res.gap_strategies[0],
        tie_tolerance=params.verdict_tie_tolerance, num_samples=params.num_samples,
        target=params.precision_target, exclude=tuple(nonfinite), exact=exact,
        words=res.exactness, proven=proven,
        gap_fast=res.gap.fast if res.gap is not None and res.gap.measurable else None)
    res.disturbed = disturbed_figures(res.gap, res.recommendation, params.precision_target)
    res.contended = contended_figures(res.gap, res.recommendation, timing, exact)
    res.kernel = kernel_bound_steps(lo, res.gap_strategies if res.gap else [])
    if builtin:
        res.form = recommended_form(res.recommendation.bench if res.recommendation else None)
    compose(res, **sizes_of(found))
    return res


def sizes_of(found: dict) -> dict:
    """The scale and edge count of the run's graph, from notebook 01 when it completed."""
    inv = found.get("01_graph_inventory")
    return {"scale": getattr(inv, "scale", None), "edges": getattr(inv, "total_edges", None)}


def exactness(lo, params, pair: list[str]) -> tuple[dict[str, str], set[str], set[str]]:
    """Every pipeline's exactness in words ("declared exact", "declared not exact", "not
    stated", or what ``equal`` found for the pair's fast side against its slow one), the
    pipelines proven equal to the slow one, and those ``equal`` showed to differ from it
    (whatever they declare: found by a user trial, a rewrite shown to differ was still given
    as the fix).

    A kept outcome of ``equal`` for the pair's sources is read; with ``verdict_check_equal``
    and none kept, the check runs here (on the run's snapshot) and its outcome is kept."""
    from ...strategies import REGISTRY

    words = {}
    for n in lo.strategies:
        declared = REGISTRY[n].exact if n in REGISTRY else lo.exact.get(n)
        words[n] = {True: "declared exact", False: "declared not exact"}.get(
            declared, "exactness not stated")
    proven: set[str] = set()
    differ: set[str] = set()
    if len(pair) != 2:
        return words, proven, differ
    slow, fast = pair
    found = proofs.targets(params.pipelines, slow, fast)
    if found is None:  # a built-in strategy: its flag is the workbook's own
        return words, proven, differ
    proof = proofs.load(params.cache_dir, *found)
    if proof is None and params.verdict_check_equal:
        proof = run_equal(params, slow, fast, found)
    if proof is not None:
        words[fast] = proof.words(slow)
        (proven if proof.equal else differ).add(fast)
    return words, proven, differ


def run_equal(params, slow: str, fast: str, found: list[str]):
    """``equal`` on the pair here (verdict_check_equal), its outcome kept; None when the two
    cannot be compared (parameters that do not pair: another model), said in the words."""
    from ...common.progress import note
    from ...data.snapshots import load_snapshot
    from ...exceptions import WorkbookError
    from ...running.environment import resolve_device
    from ..adoption.equality import check_equal

    note(f"05: checking '{fast}' against '{slow}' with equal (verdict_check_equal)")
    try:
        res = check_equal(params, slow, fast, load_snapshot(params.data),
                          resolve_device(params.device))
    except (WorkbookError, ValueError) as exc:
        note(f"05: equal could not compare them: {' '.join(str(exc).split())[:200]}")
        return None
    proofs.save(params.cache_dir, *found, res.equal, res.summary())
    return proofs.load(params.cache_dir, *found)


def judge_claims(inv, mc, timing, ddp, params: Params, run_dir: Path,
                 device_type: str) -> tuple[list[Claim], str]:
    """The investigation's claims, judged only when built-in strategies ran (they are about its
    models); the gap claims only when this run's gap is the investigated pair."""
    if not params.strategies:
        return [], ("no built-in strategy ran (strategies: []): the investigation's claims are "
                    "about its own models and are not judged on your pipelines")
    on_pair = list(params.gap_strategies) == [LAZY, DANGO]
    cl = claims_mod.check_claims(inv, mc, timing, ddp if on_pair else None,
                                 device_type=device_type, hidden=params.hidden,
                                 bench=_bench(run_dir, mc)[0])
    note = "" if on_pair else ("the epoch-gap claims are about the Lazy and DANGO-style models; "
                               "this run's gap is another pair, so they are not judged")
    return cl, note
