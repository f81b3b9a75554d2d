"""The verdict's causes, recommendation and disturbed-run rule, and compare's judgement, each
driven both ways with realistic inputs (the shapes of a default run's results)."""
import json

import pytest

from workbook_lib.tools import compare as cmp
from workbook_lib.studies import verdict as V
from workbook_lib.tools.headlines import FITTED, RATIO, Figure
from workbook_lib.studies.ddp.summary import within_noise
from workbook_lib.measurement.timing import Stat
from workbook_lib.results.ddp import GapDecomposition
from workbook_lib.results.timing import ArmResult


def st(median, rel=0.02, n=12):
    """A Stat of n samples spread +-rel around median."""
    return Stat.from_samples([median * (1 + rel * x) for x in (-1, 0, 1)] * (n // 3))


def arm(name, b, stages, untracked=0.001, rel=0.02):
    """A full-step arm whose step is its stages plus the loop's own time."""
    stage = {k: st(v, rel) for k, v in stages.items()}
    return ArmResult(f"{name}/full", name, "full", "full", b, 1,
                     st(sum(stages.values()) + untracked, rel), stage)


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _loops(arms, interleaved=True):
    from workbook_lib.results.timing import LoopStudy

    return LoopStudy("cpu", "", list(arms), {n: a.batch_size for n, a in arms.items()},
                     interleaved, {}, {f"{n}/full": a for n, a in arms.items()})


def _timing(lazy_loader=0.030, lazy_model=0.100, dango_model=0.012, fast_prep=0.0):
    # a default run's shape: Lazy B=7 spends ~130 ms a step, DANGO B=16 ~14 ms
    arms = {"replicated_mask_cpu": arm("replicated_mask_cpu", 7, {
                "loader_wait": lazy_loader, "h2d": 1e-5, "device_prep": 1e-4,
                "forward": lazy_model * 0.4, "backward": lazy_model * 0.5,
                "optimizer": lazy_model * 0.1}),
            "dango_wildtype": arm("dango_wildtype", 16, {
                "loader_wait": 0.0005, "h2d": 1e-5, "device_prep": 1e-4 + fast_prep,
                "forward": dango_model * 0.4, "backward": dango_model * 0.5,
                "optimizer": dango_model * 0.1}),
            "node_mask_shared": arm("node_mask_shared", 7, {
                "loader_wait": 0.0004, "h2d": 1e-5, "device_prep": 1e-4, "forward": 0.004,
                "backward": 0.005, "optimizer": 0.001})}
    return _Obj(loops=_loops(arms), syncs=_Obj(per_step={"replicated_mask_cpu": 21.0,
                                                         "dango_wildtype": 3.0}))


def _ddp(factor=1.0, rel=0.02, total_rel=0.02):
    f = st(factor, rel)
    g = GapDecomposition("replicated_mask_cpu", "dango_wildtype",
                         {"replicated_mask_cpu": 7, "dango_wildtype": 16}, 2, 1, 16 / 7,
                         st(9.0, total_rel), f, within_noise(f), st(20.0, total_rel))
    worlds = {1: _Obj(step=st(0.01)), 2: _Obj(step=st(0.012))}
    return _Obj(gap=g, worlds=worlds, gap_strategies=["replicated_mask_cpu", "dango_wildtype"])


def _causes(t, ddp=None, slow="replicated_mask_cpu", fast="dango_wildtype", n=1000,
            device="cpu"):
    """notebook 05's gap and its causes, as build_verdict computes them."""
    g = V.measure_gap(t.loops, slow, fast, n, ddp)
    return V.rank_causes(t, g.slow, g.fast, g, device)


def _gap(t, ddp=None):
    return V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000, ddp)


def test_causes_shares_are_of_the_measured_gap_with_the_rest_apart():
    causes = _causes(_timing(), _ddp())
    timed = [c for c in causes if c.share is not None]
    assert sum(c.share for c in timed) == pytest.approx(1.0)  # adds - saves + rest = 100%
    model = [c for c in causes if c.stage in ("forward", "backward", "optimizer")]
    assert all(c.effect == "adds" for c in model)
    assert 0.7 < sum(c.share for c in model) < 0.9  # 100 ms of ~131 vs ~13
    # one row per stage, the largest first: the backward (50 ms of the slow step's model)
    assert causes[0].stage == "backward" and causes[0].cause == "backward"
    rest = next(c for c in causes if c.effect == "rest")
    # symmetric samples: the stage medians add up to the step's (the rest is only the 10 us
    # host-to-device stage a CPU run does not attribute)
    assert abs(rest.share) < 1e-3
    # stage medians of skewed samples do not add up to the step median: the rest shows it
    t = _timing()
    fwd, bwd = [0.01, 0.02, 0.10] * 4, [0.10, 0.02, 0.01] * 4  # medians 0.02 + 0.02
    t.loops.arms["replicated_mask_cpu/full"] = ArmResult(
        "replicated_mask_cpu/full", "replicated_mask_cpu", "full", "full", 7, 1,
        Stat.from_samples([f + b for f, b in zip(fwd, bwd)]),  # median 0.11
        {"forward": Stat.from_samples(fwd), "backward": Stat.from_samples(bwd)})
    causes = _causes(t, _ddp())
    rest = next(c for c in causes if c.effect == "rest")
    steps_slow = -(-800 // 7)  # 80% of 1000 samples at batch 7
    assert rest.difference_s == pytest.approx((0.11 - 0.04) * steps_slow, rel=1e-3)
    assert sum(c.share for c in causes if c.share is not None) == pytest.approx(1.0)


def test_a_cause_that_saves_time_is_apart_not_a_negative_share_of_the_extra():
    # the fast pipeline spends 20 ms more in device prep than the slow one: that saves time
    causes = _causes(_timing(fast_prep=0.020), _ddp())
    prep = next(c for c in causes if c.stage == "device_prep")
    assert prep.effect == "saves" and prep.share < 0
    assert all(c.effect == "adds" for c in causes if c.share is not None and c.share > 0
               and c.effect != "rest")
    none = _causes(_timing(), _ddp())
    assert not [c for c in none if c.effect == "saves" and abs(c.share) > 0.01]


def test_the_gap_basis_names_the_ratio_of_the_medians_beside_the_paired_one():
    t = _timing()
    g = _gap(t, _ddp())
    lo = t.loops
    of_medians = (lo.arm("replicated_mask_cpu").step.median * g.steps["replicated_mask_cpu"]
                  / (lo.arm("dango_wildtype").step.median * g.steps["dango_wildtype"]))
    assert f"the ratio of the two medians (notebook 03's tables) is {of_medians:.3g}x" in g.basis
    assert f"the median of the rounds' ratios, {g.ratio.median:.3g}x" in g.basis


def test_a_stage_within_its_noise_is_shown_not_booked():
    t = _timing()
    slow_arm = t.loops.arms["replicated_mask_cpu/full"]
    # the slow side's optimizer spreads 0.4-7.6 ms a step (0.05-0.87 s per epoch of 115 steps),
    # the fast side's 8 ms a step is 0.4 s per epoch of 50: the ranges overlap
    slow_arm.stages["optimizer"] = st(0.004, rel=0.9)
    t.loops.arms["dango_wildtype/full"].stages["optimizer"] = st(0.008)
    causes = _causes(t, _ddp())
    opt = next(c for c in causes if c.stage == "optimizer")
    assert opt.effect == "noise" and opt.share is None and opt.difference_s is not None
    assert "within the noise" in opt.evidence and causes.index(opt) > \
        causes.index(next(c for c in causes if c.effect == "rest"))
    rest = next(c for c in causes if c.effect == "rest")
    assert "optimizer" in rest.evidence  # its difference stays in the rest
    assert sum(c.share for c in causes if c.share is not None) == pytest.approx(1.0)
    assert opt not in V.first_causes(causes)
    # the same medians, each side within 2%: the difference is resolved and booked
    slow_arm.stages["optimizer"] = st(0.004)
    opt = next(c for c in _causes(t, _ddp()) if c.stage == "optimizer")
    assert opt.effect == "adds" and opt.share > 0


def _mask_cost(mem=None):
    return _Obj(memory=_Obj(per_sample=lambda: dict(mem or {})),
                bench=_Obj(full_size=False, ratio_vs_lazy_form=st(5.0), ratio_vs_sparse_form=None,
                           passes_per_sample=st(0.3)))


def test_recommendation_fastest_exact_and_memory_tie_break(tmp_path):
    t = _timing()
    r = V.recommend(t, _mask_cost(), _ddp(), tmp_path, baseline="replicated_mask_cpu",
                    tie_tolerance=0.15, num_samples=1000)
    assert r.strategy == "node_mask_shared" and r.tied == ["node_mask_shared"]
    # replicated 131.1 ms / 7 against shared 11.5 ms / 7 per sample, paired by round
    assert r.speedup.median == pytest.approx(0.13111 / 0.01151, rel=1e-6)
    # a tie within 15%: the one with less measured memory per sample wins, never a missing one
    t.loops.arms["replicated_mask_cpu/full"] = arm("replicated_mask_cpu", 7, {"forward": 0.0111})
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6, "replicated_mask_cpu": 1e6}),
                    _ddp(), tmp_path, baseline="replicated_mask_cpu", tie_tolerance=0.15,
                    num_samples=1000)
    assert set(r.tied) == {"node_mask_shared", "replicated_mask_cpu"}
    assert r.strategy == "replicated_mask_cpu"
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6}), _ddp(), tmp_path,
                    baseline="dango_wildtype", tie_tolerance=0.15, num_samples=1000)
    assert r.strategy == r.fastest and "not measured for all" in r.tie_rule
    # the slow side among the tied, memory not measured for all: no switch is shown to pay
    # (a user trial: a pair within the noise recommended the faster median, either side)
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6}), _ddp(), tmp_path,
                    baseline="replicated_mask_cpu", tie_tolerance=0.15, num_samples=1000)
    assert r.strategy == "replicated_mask_cpu" and r.alternative == "node_mask_shared"
    assert "its gap to them not resolved: on these figures no switch from it is shown to pay" \
        in r.tie_rule
    assert r.speedup is None  # the slow one's own figure against itself: none
    assert 1.0 < r.alternative_speedup.median < 1.15  # the tied other's, within 15%
    assert set(r.epochs_per_day) == {"replicated_mask_cpu", "node_mask_shared"}
    # the same tie where the pair's gap is resolved (a review: a measured 1.12x gap was told
    # 'no switch pays'): the faster side is recommended, as before
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6}), _ddp(), tmp_path,
                    baseline="replicated_mask_cpu", tie_tolerance=0.15, num_samples=1000,
                    gap_fast="node_mask_shared")
    assert r.strategy == "node_mask_shared" and r.alternative == "" and r.speedup.median > 1.0
    # the slow side the fastest median itself, another tied with it: that one is named too
    t.loops.arms["replicated_mask_cpu/full"] = arm("replicated_mask_cpu", 7, {"forward": 0.0100})
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6}), _ddp(), tmp_path,
                    baseline="replicated_mask_cpu", tie_tolerance=0.15, num_samples=1000)
    assert r.strategy == r.fastest == "replicated_mask_cpu"
    assert r.alternative == "node_mask_shared" and r.alternative_speedup.median < 1.0
    # ... unless the pair's resolved gap says the other is the faster (same rounds): it wins
    r = V.recommend(t, _mask_cost({"node_mask_shared": 5e6}), _ddp(), tmp_path,
                    baseline="replicated_mask_cpu", tie_tolerance=0.15, num_samples=1000,
                    gap_fast="node_mask_shared")
    assert r.strategy == "node_mask_shared" and "the faster side of the pair's resolved gap" \
        in r.tie_rule


def _timing_rel(rel):
    """_timing's arms with every step spread +-rel, in another order for each arm (a disturbed
    machine: the rounds do not pair the disturbance away)."""
    t = _timing()
    for i, (k, a) in enumerate(list(t.loops.arms.items())):
        x = arm(a.strategy, a.batch_size, {s: v.median for s, v in a.stages.items()}, rel=rel)
        order = x.step.samples[i:] + x.step.samples[:i]
        x.step = Stat.from_samples(order)
        t.loops.arms[k] = x
    return t


def test_disturbed_figures_are_named_and_not_relied_on():
    quiet = V.disturbed_figures(_gap(_timing(), _ddp()), None, 0.10)
    assert quiet == {}
    loud = V.disturbed_figures(_gap(_timing_rel(0.3), _ddp(rel=0.2)), None, 0.10)
    assert set(loud) == {"gap", "per_step_ratio", "ddp_factor"}
    assert loud["per_step_ratio"] > 0.3  # two +-30% sides paired by round


def _figure(value, iqr=None, se=None, kind=RATIO, better="higher", key="x"):
    return Figure(key, "label", "02", value, iqr, None, "x", better, kind, se)


def test_compare_judges_beyond_the_noise_only():
    assert cmp._verdict(_figure(10.0, 1.0), _figure(12.0, 1.0))[1] == "better"
    assert cmp._verdict(_figure(10.0, 1.0), _figure(8.0, 1.0))[1] == "worse"
    # 15% apart but the IQRs overlap: no direction (the old fixed 5% said "better")
    text, cls = cmp._verdict(_figure(10.0, 3.0), _figure(11.5, 3.0))
    assert cls == "" and "within noise" in text
    # a coefficient: two standard errors; a negative one has no direction
    fit = dict(kind=FITTED, better="lower")
    assert cmp._verdict(_figure(1.0, se=0.01, **fit), _figure(0.8, se=0.01, **fit))[1] == \
        "better"
    assert cmp._verdict(_figure(1.0, se=0.2, **fit), _figure(0.8, se=0.2, **fit))[1] == ""
    text, cls = cmp._verdict(_figure(1.0, se=0.01, **fit), _figure(-0.5, se=0.01, **fit))
    assert cls == "" and "negative" in text
    assert cmp._verdict(_figure(1.0, **fit), _figure(0.8, **fit))[1] == ""  # no se: no noise
    # exact figures (a count): equal, or a direction for any difference
    exact = dict(kind="arithmetic", better="lower")
    assert cmp._verdict(_figure(12117.0, **exact), _figure(12117.0, **exact))[0] == "equal"
    assert cmp._verdict(_figure(12117.0, **exact), _figure(12000.0, **exact))[1] == "better"


def test_compare_formats_counts_and_accepts_another_scale(tmp_path):
    assert cmp.fmt_value(242337.0) == "242,337" and cmp.fmt_value(0.01234) == "0.01234"
    a = {"snapshot": "string12", "seed": 0, "scale": 0.1}
    assert cmp.same_snapshot_other_scale([a, dict(a, scale=1.0)])
    assert not cmp.same_snapshot_other_scale([a, dict(a, snapshot="/x/graph.pt", scale=1.0)])
    assert not cmp.same_snapshot_other_scale([a, dict(a)])
    run = tmp_path / "r"
    run.mkdir()
    (run / "environment.json").write_text(json.dumps({"params": a}))
    assert cmp._params(run) == a


def _verdict(t, ddp, rec=None, builtin=True):
    from workbook_lib.report import verdict_view as view

    g = _gap(t, ddp)
    v = V.VerdictResult("", "cpu", "cpu", V.rank_causes(t, g.slow, g.fast, g, "cpu"), [], rec,
                        g.ratio, [], [], disturbed=V.disturbed_figures(g, rec, 0.10),
                        gap=g, gap_strategies=[g.slow, g.fast], builtin=builtin)
    V.compose(v, 0.1, 242337)
    return v


def test_the_answer_does_not_rest_on_disturbed_figures():
    quiet = _verdict(_timing(), _ddp())
    assert quiet.lead.startswith("**Replicated masks") and "slower per epoch" in quiet.lead
    # no profile and no second batch size in these timings: nothing to advise from, said so
    assert "first cause: backward" in quiet.lead and "change first:" not in quiet.lead
    assert "no change follows from these figures alone" in quiet.lead
    assert "'replicated_mask_cpu' was not profiled" in quiet.lead
    assert not [c for c in quiet.caveats if "Disturbed" in c]
    loud = _verdict(_timing_rel(0.3), _ddp())
    assert "disturbed, not relied on" in loud.lead  # the gap itself is marked where quoted
    line = next(c for c in loud.caveats if c.startswith("Disturbed, not relied on"))
    assert "the epoch-time gap" in line and "the per-step ratio" in line
    assert "no contention seen" in line and "quieter machine" not in line  # nothing else ran
    assert loud.answer.index(loud.lead) == 0  # the answer opens with its one sentence


def test_run_bench_figures_are_the_paired_per_sample_ratios(ci_params):
    """run_bench's derived figures from its own interleaved rounds: per sample = step / B,
    the ratios per round, passes per sample = shared per sample over one wildtype step."""
    from workbook_lib.studies.mask_cost.bench import run_bench

    p = ci_params.replace(min_repeats=3, time_budget_s=0.05, precision_target=0.5, hidden=8,
             layers=1, bench_replicated_max_batch=64)  # ci caps it at 2; B = 4 is measured here
    b = run_bench(p, full_size=False, device="cpu")
    assert not b.full_size and b.sizes["scale"] == 0.005 and b.exact_max_rel_error < 1e-4

    def per(k):
        return [x / b.per_sample_s[k].batch_size for x in b.steps[k].samples]

    def med(xs):
        return Stat.from_samples(xs).median
    assert b.per_sample_s["shared"].median == pytest.approx(med(per("shared")))
    assert b.passes_per_sample.median == pytest.approx(
        med([s / w for s, w in zip(per("shared"), b.steps["wildtype"].samples)]))
    # B = 4 fits: the replicated figure is its step at the shared form's batch, per round; the
    # projection from B = 1 and 2 (same rounds) is kept beside it, with its error there
    rep = b.replicated["replicated_gather_scatter"]
    assert b.sizes["layers"] == 3 and b.run_layers == 1  # bench_min_layers: the delta form
    from workbook_lib.nodemask.delta import default_push_kernel
    assert b.push_kernel == default_push_kernel("cpu")  # numba where installed, recorded
    assert b.shared_form == f"delta, push {b.push_kernel}"
    assert rep.measured and rep.at_batch == b.per_sample_s["shared"].batch_size == 4
    assert rep.per_sample.samples == pytest.approx(
        [x / 4 for x in b.steps["replicated_gather_scatter@4"].samples])
    assert rep.projected.samples == pytest.approx(
        [(t1 * (2 - rep.at_batch) + t2 * (rep.at_batch - 1)) / rep.at_batch
         for t1, t2 in zip(b.steps["replicated_gather_scatter@1"].samples,
                           b.steps["replicated_gather_scatter@2"].samples)])
    assert rep.check_batch == 4 and rep.projection_error.samples == pytest.approx(
        [a / m for a, m in zip(rep.projected.samples, rep.per_sample.samples)])
    assert b.ratio_vs_lazy_form.median == pytest.approx(
        med([r / s for r, s in zip(rep.per_sample.samples, per("shared"))]))


def test_stored_mask_reads_cold_then_warm(tmp_path):
    from conftest import make_graph

    from workbook_lib.studies.timing import stored_masks as cp
    from workbook_lib.data.perturbations import sample_perturbations

    g = make_graph(num_genes=40, types={"a": 300, "b": 200}, seed=1)
    pert = sample_perturbations(40, 2, 16, seed=0)
    r = cp.stored_mask_reads(g, pert, rounds=2, storage_dir=tmp_path)
    assert r.items == 16 and r.bytes_per_item == 500 and r.file_bytes >= 16 * 500
    assert r.cold_ms.n == r.warm_ms.n == r.cold_over_warm.n == 2
    assert r.cold_over_warm.median == pytest.approx(Stat.from_samples(
        [c / w for c, w in zip(r.cold_ms.samples, r.warm_ms.samples)]).median)
    with pytest.raises(ValueError, match="'rounds'"):
        cp.stored_mask_reads(g, pert, rounds=0, storage_dir=tmp_path)


def test_a_disturbed_loop_does_not_pick_the_fix_by_its_medians(tmp_path):
    """Quiet: a strategy 20% slower than the fastest is not tied (15% tolerance). Disturbed
    (median not known to the target, IQRs overlapping): this run cannot tell them apart, so they
    are tied and the measured memory decides."""
    def timing(rel):
        t = _timing()
        t.loops.arms["node_mask_shared/full"] = arm("node_mask_shared", 7, {"forward": 0.010},
                                                    rel=rel)
        t.loops.arms["replicated_mask_cpu/full"] = arm("replicated_mask_cpu", 7,
                                                       {"forward": 0.012}, rel=rel)
        return t
    mem = _mask_cost({"node_mask_shared": 5e6, "replicated_mask_cpu": 1e6})
    kw = dict(baseline="dango_wildtype", tie_tolerance=0.15, num_samples=1000, target=0.10)
    quiet = V.recommend(timing(0.02), mem, _ddp(), tmp_path, **kw)
    assert quiet.strategy == "node_mask_shared" and quiet.tied == ["node_mask_shared"]
    loud = V.recommend(timing(0.3), mem, _ddp(), tmp_path, **kw)
    assert set(loud.tied) == {"node_mask_shared", "replicated_mask_cpu"}
    assert loud.strategy == "replicated_mask_cpu" and "disturbed" in loud.tie_rule
    # disturbed but far apart (IQRs do not overlap): the fastest still stands alone
    t = timing(0.3)
    t.loops.arms["replicated_mask_cpu/full"] = arm("replicated_mask_cpu", 7, {"forward": 0.05},
                                                   rel=0.3)
    assert V.recommend(t, mem, _ddp(), tmp_path, **kw).tied == ["node_mask_shared"]


def test_the_answer_marks_a_disturbed_ddp_factor_and_bench_ratio():
    rec = V.Recommendation("node_mask_shared", "", "shared", st(1.6), "replicated_mask_cpu",
                           st(11.0), "node_mask_shared", ["node_mask_shared"], "",
                           bench=_Obj(full_size=True, ratio_vs_lazy_form=st(60.0, 0.3),
                                      passes_per_sample=None))
    quiet = _verdict(_timing(), _ddp(), rec)
    assert "60x faster" in quiet.answer and "disturbed or contended figure" in quiet.answer
    # a factor not booked is evidence the answer does not rest on: a note, not a caveat
    assert any(c.startswith("DDP factor at 2 ranks 1 (IQR 0.04)") and "not booked" in c
               for c in quiet.notes)
    assert not any("DDP factor" in c for c in quiet.caveats)
    loud = _verdict(_timing(), _ddp(rel=0.25), rec)
    assert any(c.startswith("DDP factor at 2 ranks 1 (IQR 0.5)") and "not booked" in c
               for c in loud.notes)
    assert not any("DDP factor" in c for c in loud.caveats)
    rec.bench.ratio_vs_lazy_form = st(60.0)
    assert "disturbed or contended figure" not in _verdict(_timing(), _ddp(), rec).answer


def test_separate_launch_figures_are_not_labelled_same_rounds(tmp_path, monkeypatch):
    """04's DDP factor, the gap that multiplies it in and the weak-scaling efficiency divide
    separately launched runs: their kind says so, and stability's note does not call a
    difference between runs one of 'steps in the same rounds'."""
    from workbook_lib.tools import headlines as hl
    from workbook_lib.tools import stability as stab

    kinds = {key: kind for key, _l, _nb, _u, _b, kind, _g in hl.SPECS}
    for key in ("gap_total", "ddp_factor", "weak_efficiency"):
        assert kinds[key] == hl.LAUNCHES and "same rounds" not in kinds[key], key
    assert kinds["per_step_ratio_04"] == RATIO  # paired by round within one launch

    def fig(v, iqr, kind):
        return Figure("ddp_factor", "DDP factor", "04_ddp_scaling", v, iqr, None, "x", "lower",
                      kind)
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for d in runs:
        d.mkdir()
    values = {"run1": 1.0, "run2": 1.5}
    monkeypatch.setattr(stab, "headline_figures",
                        lambda d: {"ddp_factor": fig(values[d.name], 0.05, hl.LAUNCHES)})
    row = next(r for r in stab.compare_figures(runs).rows if r.key == "ddp_factor")
    assert row.agrees is False and row.kind == hl.LAUNCHES
    assert "separate launches" in row.note and "same rounds" not in row.note


def test_a_ddp_factor_within_its_noise_is_shown_not_booked():
    """A factor whose IQR holds 1 is noise: shown, with no share, and the booked rows still add
    to 100% of the gap; beyond its IQR it is booked, adding or saving time."""
    def rows(factor, rel):
        causes = _causes(_timing(), _ddp(factor=factor, rel=rel))
        return causes, next(c for c in causes if c.cause.startswith("DDP"))
    causes, noisy = rows(1.01, 0.2)  # a default run's 1.012 (IQR 0.24)
    assert noisy.effect == "noise" and noisy.share is None and "within its IQR" in noisy.evidence
    assert sum(c.share for c in causes if c.share is not None) == pytest.approx(1.0)
    causes, adds = rows(1.3, 0.02)
    assert adds.effect == "adds" and adds.share > 0
    assert sum(c.share for c in causes if c.share is not None) == pytest.approx(1.0)
    assert rows(0.8, 0.02)[1].effect == "saves"
    # clear of 1 but disturbed (not known to the 10% target): shown, not booked
    causes, shaky = rows(1.5, 0.15)
    assert shaky.effect == "noise" and shaky.share is None and "disturbed" in shaky.evidence
    assert sum(c.share for c in causes if c.share is not None) == pytest.approx(1.0)


def test_a_contended_ddp_factor_is_not_booked():
    from workbook_lib.measurement.cpu import CpuShare

    ddp = _ddp(factor=1.5, rel=0.02)
    ddp.gap.ddp_factor.cpu = CpuShare(1.0, 0.4, 2, 2, 10, run_s=0.4, wait_s=0.6)
    causes = _causes(_timing(), ddp)
    row = next(c for c in causes if c.stage == "ddp")
    assert row.effect == "noise" and row.share is None and "contended" in row.evidence


def test_the_pair_listed_the_other_way_round_is_explained_the_right_way():
    from workbook_lib.report import verdict_view as view

    t = _timing()
    g = V.measure_gap(t.loops, "dango_wildtype", "replicated_mask_cpu", 1000, _ddp())
    assert g.swapped and (g.slow, g.fast) == ("replicated_mask_cpu", "dango_wildtype")
    assert g.ratio.median > 1 and g.listed == ["dango_wildtype", "replicated_mask_cpu"]
    v = V.VerdictResult("", "cpu", "cpu", V.rank_causes(t, g.slow, g.fast, g, "cpu"), [], None,
                        g.ratio, [], [], gap=g, gap_strategies=[g.slow, g.fast])
    V.compose(v)
    assert "slower per epoch than" in v.lead and "0." not in v.lead.split("x slower")[0]
    assert v.caveats[0].startswith("Listed the other way round")
    assert v.causes[0].stage == "backward" and v.causes[0].effect == "adds"
    assert sum(c.share for c in v.causes if c.share is not None) == pytest.approx(1.0)


def test_no_measurable_gap_ranks_no_cause():
    from workbook_lib.report import verdict_view as view

    t = _timing()
    a = t.loops.arms["replicated_mask_cpu/full"]
    t.loops.arms["again/full"] = ArmResult("again/full", "again", "full", "full", 7, 1,
                                           st(a.step.median, 0.05), dict(a.stages))
    t.loops.strategies.append("again")
    g = V.measure_gap(t.loops, "replicated_mask_cpu", "again", 1000)
    assert not g.measurable
    causes = V.rank_causes(t, g.slow, g.fast, g, "cpu")
    assert all(c.share is None for c in causes) and V.first_causes(causes) == []
    v = V.VerdictResult("", "cpu", "cpu", causes, [], None, g.ratio, [], [], gap=g,
                        gap_strategies=[g.slow, g.fast])
    V.compose(v)
    assert "same speed within the noise" in v.lead and "first cause" not in v.lead


def test_a_gap_one_step_vetoes_is_not_called_the_same_speed():
    """Found by a user trial: a 1.52x ratio (quartiles 1.51-1.64, n = 6) that one disturbed step
    (0.70x) kept unresolved was headlined 'IQR holds 1' and told 'the same speed within the
    noise'. It now says why, and how many steps would resolve it; an IQR that holds 1 is still
    the same speed (both ways)."""
    t = _timing()
    a = t.loops.arms["replicated_mask_cpu/full"]

    def verdict(ratios):
        steps = Stat.from_samples([a.step.samples[i % a.step.n] / x for i, x in enumerate(ratios)])
        t.loops.arms["other/full"] = ArmResult("other/full", "other", "full", "full",
                                               a.samples_per_step, 1, steps, dict(a.stages))
        if "other" not in t.loops.strategies:
            t.loops.strategies.append("other")
        g = V.measure_gap(t.loops, "replicated_mask_cpu", "other", 1000)
        v = V.VerdictResult("", "cpu", "cpu", V.rank_causes(t, g.slow, g.fast, g, "cpu"), [],
                            None, g.ratio, [], [], gap=g, gap_strategies=[g.slow, g.fast])
        V.compose(v)
        return g, v
    g, v = verdict([0.70, 1.53, 1.52, 1.50, 1.75, 1.67])
    assert not g.measurable
    assert "a 1.52x gap is not resolved" in v.lead and "same speed" not in v.lead
    assert "1 of 6 paired steps the other way (0.7x)" in v.lead
    assert "at least 9 paired steps would resolve one" in v.lead
    from workbook_lib.studies.verdict.answer import headline
    head = headline(v)
    assert "no measurable gap (1.52x per epoch, 1 of 6 paired steps the other way (0.7x))" in head
    assert "IQR holds 1" not in head
    g, v = verdict([0.9, 1.1, 1.0, 1.2, 0.95, 1.05])
    assert "same speed within the noise" in v.lead and "its IQR holds 1" in v.lead
    assert "IQR holds 1" in headline(v)
    # a user trial: a ratio whose median is known only to +-13% (disturbed) was told 'the same
    # speed' beside a stage that differed 170-fold: neither is told then (both ways above)
    v.disturbed = {"gap": 0.13}
    V.compose(v)
    assert "no gap is resolved" in v.lead and "same speed" not in v.lead.replace(
        "tell neither the same speed", "")
    assert "these figures tell neither the same speed nor a gap" in v.lead


def test_on_a_gpu_the_sync_wait_is_carved_out_of_its_stage_and_can_change_the_advice():
    """The forward's syncs: on a CPU counted, their cost not measured, the stage's advice kept;
    on a GPU the host's wait at them (profiled) is part of the forward's time, never added to
    it, and when it is most of the forward's difference the advice is the syncs'."""
    from workbook_lib.measurement.profiling import ProfileResult

    def timing(wait_ms):
        t = _timing()
        a = t.loops.arms["replicated_mask_cpu/full"]
        a.syncs_by_stage = {"forward": 70.0}
        t.loops.arms["dango_wildtype/full"].syncs_by_stage = {"forward": 1.0}
        t.profiles = {n: ProfileResult({"wait": 1, "warmup": 1, "active": 2, "cuda": 1}, "", 0.1,
                                       sync_wait={"forward": 2 * w / 1e3})
                      for n, w in (("replicated_mask_cpu", wait_ms), ("dango_wildtype", 0.1))}
        return t
    cpu = next(c for c in _causes(timing(35.0)) if c.stage == "forward")
    assert cpu.syncs == (70.0, 1.0) and "not measured here" in cpu.evidence
    # no second batch size in these timings: nothing grows, no advice on a CPU
    assert cpu.sync_wait_s is None and cpu.advice == ""
    gpu = next(c for c in _causes(timing(35.0), device="cuda") if c.stage == "forward")
    steps = -(-800 // 7)
    assert gpu.sync_wait_s == pytest.approx(0.035 * steps - 0.0001 * -(-800 // 16))
    assert gpu.difference_s == cpu.difference_s  # carved out, never added
    assert gpu.advice == V.SYNC_ADVICE and "waited 35 ms per step" in gpu.evidence
    few = next(c for c in _causes(timing(2.0), device="cuda") if c.stage == "forward")
    assert few.advice == ""


def test_a_gap_inside_the_precision_target_is_not_resolved():
    """A precise 1.05x (IQR clear of 1) is inside the 10% target the figures were repeated for:
    no gap; a precise 1.5x is one; a precise 0.6x is one the other way round."""
    def stat(m):
        return Stat.from_samples([m * (1 + 0.005 * x) for x in (-1, 0, 1)] * 4, unit="ratio")
    assert V.resolved(stat(1.05), 0.10) == 0
    assert V.resolved(stat(1.5), 0.10) == 1 and V.resolved(stat(0.6), 0.10) == -1
    assert V.resolved(stat(1.05), 0.02) == 1  # a tighter target resolves it


def test_a_gap_one_paired_step_contradicts_is_not_resolved():
    """One pipeline timed twice on a loaded machine (the matrix's same_twice case, measured):
    six paired ratios, median 1.13x, IQR clear of 1, but one pair below 1: the median's
    interval (their range) holds 1, so no gap; the same six with that pair above 1 resolve."""
    once = [0.97, 1.02, 1.10, 1.16, 1.45, 1.60]
    assert Stat.from_samples(once, unit="ratio").q1 > 1.0
    assert V.resolved(Stat.from_samples(once, unit="ratio"), 0.10) == 0
    agree = [1.01] + once[1:]
    assert V.resolved(Stat.from_samples(agree, unit="ratio"), 0.10) == 1
    assert V.resolved(Stat.from_samples([1 / x for x in agree], unit="ratio"), 0.10) == -1
    assert V.resolved(Stat.from_samples([1 / x for x in once], unit="ratio"), 0.10) == 0


def test_the_equal_command_the_answer_prints_runs_as_printed():
    """The command names the specs the run was given (a name alone is not importable), with
    ``NAME=`` where the name is not the file's."""
    from types import SimpleNamespace

    from workbook_lib.studies.verdict.answer import equal_command

    v = SimpleNamespace(gap=SimpleNamespace(slow="slow_gene", fast="quick"),
                        specs={"slow_gene": "/tmp/u/slow_gene.py:make_pipeline",
                               "quick": "my_pkg.models:make_fast"}, params_args="")
    assert equal_command(v) == ("python -m workbook_lib equal /tmp/u/slow_gene.py:make_pipeline "
                                "quick=my_pkg.models:make_fast")
    v.specs = {}  # built-in strategies: their names are what the command takes
    assert equal_command(v) == "python -m workbook_lib equal slow_gene quick"


def test_the_equal_command_carries_the_runs_params(tmp_path, capsys):
    """A user trial: 05's `equal` command had no params, so `equal` built the pair on the
    default params' graph, not the one the run measured. It names the run folder's params file
    where that holds the run's params, else the keys that differ from the defaults; either way
    the printed command checks the pair on the run's graph."""
    import shlex
    from types import SimpleNamespace

    from workbook_lib import cli
    from workbook_lib.configs.validation import (load_params_file, params_file_name,
                                                 params_yaml)
    from workbook_lib.studies.verdict import params_args
    from workbook_lib.studies.verdict.answer import equal_command

    specs = [f"examples/{n}.py:make_pipeline" for n in ("lazy_pyg", "nodemask_pyg", "dango_pyg")]
    # a run of three pipelines, 04 on the third (a review: `equal` on its params refused it)
    p = load_params_file("ci").replace(hidden=8, layers=1, strategies=[], pipelines=specs,
                                       gap_strategies=["lazy_pyg", "nodemask_pyg"],
                                       ddp_strategy="dango_pyg")
    sets = params_args(p, tmp_path)  # no params file in the folder: the keys set
    assert sets.startswith("--set ") and "hidden=8" in sets and "layers=1" in sets
    name = params_file_name(p)  # named by its content: a later run's other params do not
    assert name != params_file_name(p.replace(hidden=4))  # rewrite the file 05 named
    (tmp_path / name).write_text(params_yaml(p))
    assert params_args(p, tmp_path) == f"--params {tmp_path / name}"
    assert params_args(p.replace(hidden=4), tmp_path).startswith("--set ")  # another run's
    for args in (sets, params_args(p, tmp_path)):
        v = SimpleNamespace(gap=SimpleNamespace(slow="lazy_pyg", fast="nodemask_pyg"),
                            specs={"lazy_pyg": "examples/lazy_pyg.py:make_pipeline",
                                   "nodemask_pyg": "examples/nodemask_pyg.py:make_pipeline"},
                            params_args=args)
        argv = shlex.split(equal_command(v))[3:]
        assert cli.main([*argv, "--json", str(tmp_path / "eq.json")]) == 0
        doc = json.loads((tmp_path / "eq.json").read_text())
        names = {r["name"] for r in doc["rows"]}
        assert all(r["equal"] for r in doc["rows"]) and "lins.0.weight" in names  # layers=1:
        assert "lins.1.weight" not in names  # the run's, not the defaults'
        capsys.readouterr()


def test_two_causes_closer_than_the_gap_resolves_are_named_together_not_ranked():
    """The rule both ways, with the figures of a contended user run (1.55x, IQR 0.32: shares
    58% and 55%) and of a planted one (7.11x, IQR 0.19: 58% and 41%)."""
    from types import SimpleNamespace

    def cause(stage, share):
        return V.Cause(stage, "", 1.0, 0.5, 0.5, share, "measured", effect="adds", stage=stage)

    def gap(median, iqr):
        return SimpleNamespace(ratio=Stat.from_samples([median - iqr, median - iqr / 2, median,
                                                        median + iqr / 2, median + iqr]))

    near = [cause("backward", 0.58), cause("forward", 0.55)]
    g = gap(1.55, 0.32)
    assert g.ratio.iqr == pytest.approx(0.32, rel=0.01)
    assert not V.told_apart(near, g)
    assert V.told_apart([cause("forward", 0.58), cause("backward", 0.41)], gap(7.11, 0.19))
    assert V.told_apart(near[:1], g)  # one cause: nothing to rank


def test_the_recommendation_quotes_small_memory_in_its_own_unit():
    """A user pipeline's few kB per sample read '52.1 kB', not '0 MB'."""
    from workbook_lib.report import verdict_view as view

    rec = V.Recommendation("node_mask_shared", "", "shared", st(1.6), "replicated_mask_cpu",
                           st(11.0), "node_mask_shared", ["node_mask_shared"], "",
                           memory_per_sample={"node_mask_shared": 52100.0,
                                              "replicated_mask_cpu": 3.2e9})
    text = view.recommendation_text(_verdict(_timing(), _ddp(), rec)).data
    assert "52.1 kB" in text and "3.2 GB" in text and "0 MB" not in text


def test_a_named_pipelines_failure_is_a_caveat_only_where_the_answer_rests_on_it():
    """A failed memory probe in 02 is a note (the answer's gap is 03's); a failure in 03 is a
    caveat."""
    t = _timing()
    g = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000, _ddp())

    def composed(failure: str):
        v = V.VerdictResult("", "cpu", "cpu", V.rank_causes(t, g.slow, g.fast, g, "cpu"), [],
                            None, g.ratio, [], [], gap=g, gap_strategies=[g.slow, g.fast])
        v.failures = {"replicated_mask_cpu": failure}
        V.compose(v)
        return v
    probe = composed("in notebook 02: 'replicated_mask_cpu' failed in backward (mode memory "
                     "probe, B=1)")
    assert not any("memory probe" in c for c in probe.caveats)
    assert any("memory probe" in n for n in probe.notes)
    profiled = composed("in notebook 03: 'replicated_mask_cpu' failed in forward (in its "
                        "profiled steps: no profile)")
    assert any("profiled steps" in c for c in profiled.caveats)


def test_the_gap_is_of_the_pipelined_steps_where_the_loop_has_them():
    """The records of the full step add a fixed time to every step; the gap is of the steps as
    a plain loop runs them (03's pipelined arms), the causes of the full steps."""
    from workbook_lib.results.timing import PIPELINED

    t = _timing()
    before = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000)
    assert "full steps paired by round" in before.basis
    for n in ("replicated_mask_cpu", "dango_wildtype"):  # 1 ms of records per full step
        full = t.loops.arm(n, "full")
        t.loops.arms[f"{n}/{PIPELINED}"] = ArmResult(
            f"{n}/{PIPELINED}", n, PIPELINED, "full", full.batch_size, 1,
            st(full.step.median - 0.001, 0.02), {})
    g = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000)
    assert "pipelined steps" in g.basis and "the causes' shares are of the full" in g.basis
    assert g.ratio.median > before.ratio.median  # the fast side's records weigh more
    assert g.epoch_s == before.epoch_s  # the causes' basis is unchanged


def test_a_contended_step_factor_gives_no_multi_rank_epochs(tmp_path):
    """Found by a user trial: 05's epochs-per-24 h table quoted a 2-rank figure from a step
    factor measured contended, unmarked, under a note that the answer does not use contended
    figures."""
    from workbook_lib.results.cpu import CpuShare

    hog = CpuShare(wall_s=1.0, cpu_s=0.5, threads=1, allowed=1, intervals=3)
    d = _ddp()
    d.gap.step_factors = {"node_mask_shared": st(1.2),
                          "replicated_mask_cpu": st(1.7).with_cpu(hog)}
    assert d.gap.step_factors["replicated_mask_cpu"].contended
    r = V.recommend(_timing(), _mask_cost(), d, tmp_path, baseline="replicated_mask_cpu",
                    tie_tolerance=0.15, num_samples=1000)
    assert "2 ranks" in r.epochs_per_day["node_mask_shared"]
    assert list(r.epochs_per_day["replicated_mask_cpu"]) == ["1 rank"]
    assert "whose factor was measured contended, has no 2-rank figure" in r.projection_basis


def test_multi_rank_epochs_start_from_the_step_at_04s_threads_per_rank(tmp_path):
    """Found by a user trial: 03's step ran on 2 threads, 04's ranks on 1 each, and 05 put 04's
    step factor (1 thread per rank at both world sizes) on 03's 2-thread step: 134 epochs a
    day at 2 ranks against ~119 from 04's own steps. The thread effect 04 measured (its step
    with all threads over the same at 1) now takes 03's step to 1 thread first; a pipeline
    without a sound one has no multi-rank figure; with equal threads nothing changes."""
    from workbook_lib.results.cpu import CpuShare

    def rec(threads_all=None, effects=None):
        d = _ddp()
        d.gap.step_factors = {"node_mask_shared": st(1.2), "replicated_mask_cpu": st(1.5)}
        d.worlds[1].threads_all, d.worlds[1].threads_per_rank = threads_all, [1]
        d.worlds[1].thread_step_effect = effects or {}
        return V.recommend(_timing(), _mask_cost(), d, tmp_path,
                           baseline="replicated_mask_cpu", tie_tolerance=0.15, num_samples=1000)
    same = rec()
    one = same.epochs_per_day["node_mask_shared"]["1 rank"]
    assert same.epochs_per_day["node_mask_shared"]["2 ranks"] == pytest.approx(one * 2 / 1.2)
    assert "thread effect" not in same.projection_basis
    hog = CpuShare(wall_s=1.0, cpu_s=0.5, threads=1, allowed=1, intervals=3)
    fewer = rec(2, {"node_mask_shared": st(0.6), "replicated_mask_cpu": st(0.7).with_cpu(hog)})
    # 2 threads take 0.6 of 1 thread's step: 1 thread per rank is 1/0.6 x 03's step
    assert fewer.epochs_per_day["node_mask_shared"]["2 ranks"] == \
        pytest.approx(one * 2 / 1.2 * 0.6)
    assert list(fewer.epochs_per_day["replicated_mask_cpu"]) == ["1 rank"]  # contended effect
    assert "from its step at 1 thread(s) per rank (03: 2): 03's step over the thread effect" \
        in fewer.projection_basis


def test_the_fix_section_quotes_the_gaps_step_where_both_sides_have_it(tmp_path):
    """Found by a user trial: the answer said the fix's per-epoch figure was the gap above
    (11.8x, the steps a plain loop runs) while the fix section quoted 10.6x and projected its
    epochs per day from the recorded full steps. With a plain-loop arm for every pipeline the
    recommendation's speedup and epochs are the gap's steps; without, the full steps as before."""
    from workbook_lib.results.timing import PIPELINED

    t = _timing()
    base = V.recommend(t, _mask_cost(), _ddp(), tmp_path, baseline="replicated_mask_cpu",
                       tie_tolerance=0.15, num_samples=1000)
    assert base.step_words == "full training step"
    for n, a in list(t.loops.arms.items()):  # plain-loop steps 10% shorter than the full ones
        name = a.strategy
        t.loops.arms[f"{name}/{PIPELINED}"] = ArmResult(
            f"{name}/{PIPELINED}", name, PIPELINED, PIPELINED, a.batch_size, 1,
            st(a.step.median * 0.9, 0.02), {})
    r = V.recommend(t, _mask_cost(), _ddp(), tmp_path, baseline="replicated_mask_cpu",
                    tie_tolerance=0.15, num_samples=1000)
    assert r.step_words == "plain-loop training step"
    assert "the gap's steps" in r.projection_basis and "plain-loop" in r.tie_rule
    assert r.speedup.median == pytest.approx(base.speedup.median, rel=1e-6)  # both 10% shorter
    assert r.ms_per_sample.median == pytest.approx(0.9 * base.ms_per_sample.median, rel=1e-6)
    one = r.epochs_per_day["node_mask_shared"]["1 rank"]
    assert one == pytest.approx(base.epochs_per_day["node_mask_shared"]["1 rank"] / 0.9)


def test_only_a_named_cause_that_adds_to_the_gap_carries_advice():
    """Found by a user trial: the results file held stage templates for stages within noise or
    that saved time (pinned memory for a transfer that saved time, on a CPU)."""
    from workbook_lib.studies.verdict.causes import MINOR

    causes = _causes(_timing(), _ddp())
    h2d = next(c for c in causes if c.stage == "h2d")
    assert h2d.share < MINOR and h2d.advice == "" and h2d.finding  # 0.01 ms a step each
    for c in causes:
        if c.advice:
            assert c.effect == "adds" and c.share >= MINOR, c


def test_the_fix_is_provisional_when_the_steps_it_is_chosen_by_were_contended(tmp_path):
    """contended_figures reads the steps the recommendation chose by (its step_mode): a
    contended plain-loop step makes the fix provisional where the fix was chosen by plain-loop
    steps, not where it was chosen by full steps (both ways)."""
    from workbook_lib.results.cpu import CpuShare
    from workbook_lib.results.timing import PIPELINED

    hog = CpuShare(wall_s=1.0, cpu_s=0.5, threads=1, allowed=1, intervals=3)
    t = _timing()
    for n, a in list(t.loops.arms.items()):
        t.loops.arms[f"{a.strategy}/{PIPELINED}"] = ArmResult(
            f"{a.strategy}/{PIPELINED}", a.strategy, PIPELINED, PIPELINED, a.batch_size, 1,
            st(a.step.median * 0.9, 0.02).with_cpu(hog), {})
    r = V.recommend(t, _mask_cost(), _ddp(), tmp_path, baseline="replicated_mask_cpu",
                    tie_tolerance=0.15, num_samples=1000)
    assert r.step_mode == PIPELINED
    assert "loop" in V.contended_figures(None, r, t)
    r.step_mode = "full"  # chosen by the full steps, which were not contended
    assert "loop" not in V.contended_figures(None, r, t)


def test_no_cause_is_ranked_where_the_full_steps_disagree_with_the_gap(monkeypatch):
    """Found by a user trial: a 1.27x gap from the plain-loop steps beside full steps (where the
    stages are timed) that came out 0.466x: 'adds time' rows at -16%, a 'saves time' row at
    +126%, and a bridge chart whose slow epoch sat below the fast one. The stages' split is now
    not read from steps that disagree with the gap; with agreeing steps it is (both ways)."""
    from workbook_lib.results.timing import PIPELINED

    def verdict(plain):
        t = _timing()
        for n, ms in plain.items():
            a = t.loops.arm(n, "full")
            t.loops.arms[f"{n}/{PIPELINED}"] = ArmResult(f"{n}/{PIPELINED}", n, PIPELINED,
                                                         PIPELINED, a.batch_size, 1, st(ms), {})
        g = V.measure_gap(t.loops, "node_mask_shared", "replicated_mask_cpu", 1000)
        v = V.VerdictResult("", "cpu", "cpu", V.rank_causes(t, g.slow, g.fast, g, "cpu"), [],
                            None, g.ratio, [], [], gap=g, gap_strategies=[g.slow, g.fast])
        V.compose(v)
        return g, v
    # plain loop: node-mask 2x slower; full steps: node-mask ~13x faster
    g, v = verdict({"node_mask_shared": 0.2, "replicated_mask_cpu": 0.1})
    assert g.measurable and g.slow == "node_mask_shared"
    assert all(c.share is None for c in v.causes) and V.first_causes(v.causes) == []
    assert "no cause is ranked: the full steps the stages are timed in came out the other " \
           "way" in v.lead
    from workbook_lib.report import plotting
    from workbook_lib.report import verdict_view as view

    shown = []
    monkeypatch.setattr(view, "display", lambda obj: shown.append(("text", obj.data)))
    monkeypatch.setattr(plotting, "show", lambda fig, caption: shown.append(("chart", caption)))
    view.causes_plot(v)  # no bridge: the slow epoch would sit below the fast one
    assert shown == [("text", shown[0][1])] and shown[0][1].startswith("No bridge")
    g, v = verdict({"node_mask_shared": 0.01, "replicated_mask_cpu": 0.13})  # agreeing
    assert g.slow == "replicated_mask_cpu" and V.first_causes(v.causes) and g.steps_agree
    assert "no cause is ranked" not in v.lead
    shown.clear()
    view.causes_plot(v)
    assert [k for k, _ in shown] == ["chart"]


def test_sync_bound_on_a_gpu_reads_the_syncs_that_grow_with_the_batch_both_ways():
    """Found by a user trial: 14 host syncs per step of a fixed per-step function (a positional
    encoding recomputed each step), at batch 4, were called "sync-bound on a GPU" (3.5 per
    sample) where none grew with the batch. With two batch sizes run, the rule reads the syncs
    per extra sample; without, the step's syncs over its batch, as before."""
    from workbook_lib.results.timing import Growth
    from workbook_lib.studies.timing.stages import step_bound

    a = arm("pe_slow", 4, {"forward": 0.05, "backward": 0.05})
    a.syncs_per_step, a.syncs_by_stage = 14.0, {"forward": 14.0}

    def grown(per_sample):
        return {"forward": Growth("forward", (4, 2), st(1e-4), st(0.05), 0.01,
                                  syncs_per_sample=per_sample)}
    fixed = step_bound(a, grown(0.0))
    assert not fixed.sync_bound_on_gpu and fixed.syncs_per_extra_sample == 0.0
    assert "sync-bound" not in fixed.summary
    assert step_bound(a).sync_bound_on_gpu  # not measured: 3.5 per sample, the step's over B
    growing = step_bound(a, grown(3.5))
    assert growing.sync_bound_on_gpu and "3.5 more for each extra sample" in growing.summary
    # a transfer's syncs are not the model's: a growing h2d stage leaves the rule to the others
    copies = {"h2d": Growth("h2d", (4, 2), st(1e-4), st(0.05), 0.01, syncs_per_sample=5.0),
              **grown(0.0)}
    assert not step_bound(a, copies).sync_bound_on_gpu


def test_the_leads_gap_share_for_a_function_is_said_once():
    """A review: where two first causes have the headline's function as their main site, each
    said '... of the gap with its other stages'; the first one only says it now."""
    from workbook_lib.results.verdict import CodeSite

    t = _timing()
    g = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000)
    causes = V.rank_causes(t, g.slow, g.fast, g, "cpu")
    first = V.first_causes(causes)
    assert len(first) >= 2, [(c.cause, c.share) for c in causes]
    for c in first[:2]:
        c.sites = [CodeSite("Model.forward", "m.py", 8, "", 1.0, 0.0, 0.8)]
    v = V.VerdictResult("", "cpu", "cpu", causes, [], None, g.ratio, [], [], gap=g,
                        gap_strategies=[g.slow, g.fast])
    V.compose(v)
    assert v.lead.count("its time in other stages included") == 1, v.lead
    assert v.lead.count("; in `Model.forward` (defined at m.py:8): 80% of this stage's ") == 1, \
        v.lead
    assert v.lead.count("80% of its extra time in `Model.forward`") == 1, v.lead


def test_the_stage_table_marks_a_booked_stage_under_the_minor_share():
    """A user trial read identical code booked "adds time | 123 ms | 0.028%": a stage under the
    minor share is booked (the shares add to 100%) but neither named nor advised; the table
    says so, and a stage at or above it reads as before."""
    from workbook_lib.report.verdict_view import causes_table
    from workbook_lib.results.verdict import MINOR

    t = _timing()
    g = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000)
    causes = V.rank_causes(t, g.slow, g.fast, g, "cpu")
    v = V.VerdictResult("", "cpu", "cpu", causes, [], None, g.ratio, [], [], gap=g,
                        gap_strategies=[g.slow, g.fast])
    V.compose(v)
    html = causes_table(v).to_html()
    booked = [c for c in causes if c.effect in ("adds", "saves") and c.share is not None]
    small = [c for c in booked if abs(c.share) < MINOR]
    large = [c for c in booked if abs(c.share) >= MINOR]
    assert small and large, [(c.stage, c.share) for c in booked]
    assert html.count(", minor</td>") == len(small)
    assert "Minor: under 5% of the gap, booked but neither named in the answer nor advised" in html


def test_the_garbage_collector_is_a_caveat_only_where_the_slow_pipeline_pays_much_of_it():
    """gc_note both ways: a slow pipeline whose steps spent most of their time in the collector
    against none in the fast one gets the caveat with its figures: its median full step and IQR
    with and without the collector's time (a user trial: a caveat that said the pauses fell in
    "a few long steps" the medians leave out was wrong where every step paid them); at 4%
    (under GC_HIGH), with the fast one paying more, or from a results file without the
    figure, none."""
    from workbook_lib.results.timing import GC_PAUSE, ArmResult, LoopStudy
    from workbook_lib.studies.verdict.answer import caveats
    from workbook_lib.studies.verdict.causes import GC_HIGH

    def study(slow_walls, slow_pauses, fast_pauses):
        def arm(name, walls, pauses):
            extra = {} if pauses is None else {GC_PAUSE: Stat.from_samples(pauses)}
            return ArmResult(name=name, strategy=name, variant="full", mode="full",
                             batch_size=8, micro_batches=1, step=Stat.from_samples(walls),
                             extra=extra)
        return LoopStudy(device="cpu", sizes="", strategies=["slow", "fast"], batch_sizes={},
                         interleaved=True, settings={},
                         arms={"slow/full": arm("slow", slow_walls, slow_pauses),
                               "fast/full": arm("fast", [0.006] * 4, fast_pauses)})

    # a few long steps: the median step holds little of it, the IQR most of it
    rare = study([0.035, 0.29, 0.035, 0.04], [0.0016, 0.254, 0.0016, 0.0017], [0.0] * 4)
    note = V.gc_note(rare, "slow", "fast")
    assert note.startswith("Python's garbage collector took 65% of the timed steps of 'slow' "
                           "(of their summed time, every mode; at most 254 ms in one of its 4 "
                           "steps), against 0% of those of 'fast': its median full step 37.5 "
                           "ms, 34.7 ms without the collector's time (IQR 67.5 ms, 3.17 ms "
                           "without it). The gap is of medians"), note
    assert "gc.freeze()" in note
    # what an epoch pays (a user trial: gc.freeze() cut the collector from 52% to 6% and the
    # median-based gap did not move): the full steps' ratio of means beside that of medians
    assert ": the mean full step is 100 ms against the fast one's 6 ms, a ratio of 16.7x, " \
           "against 6.25x of their medians" in note, note
    # every step: the median step holds it
    every = study([0.18, 0.19, 0.30, 0.32], [0.12, 0.13, 0.12, 0.13], [0.0] * 4)
    note = V.gc_note(every, "slow", "fast")
    assert ": its median full step 245 ms, 120 ms without the collector's time" in note, note
    assert "a ratio of 41.2x, against 40.8x of their medians" in note, note
    light = [0.0016, 0.012, 0.0016, 0.0017]  # 4%
    assert sum(light) / 0.4 < GC_HIGH
    assert V.gc_note(study([0.035, 0.29, 0.035, 0.04], light, [0.0] * 4), "slow", "fast") == ""
    fast_more = [0.005] * 4  # 83% of the fast one's steps
    assert V.gc_note(study([0.035, 0.29, 0.035, 0.04], [0.0016, 0.254, 0.0016, 0.0017],
                           fast_more), "slow", "fast") == ""
    assert V.gc_note(study([0.035] * 4, [0.0016, 0.254, 0.0016, 0.0017], None),
                     "slow", "fast") == ""
    # the caveat is in the answer
    v = V.VerdictResult("", "cpu", "cpu", [], [], None, None, [], [], gc_note=note)
    assert caveats(v) == [note + "."]


def test_the_collector_in_dataloader_workers_is_a_caveat_of_its_own():
    """With DataLoader workers the training process never sees their collections: a slow
    pipeline whose workers spent 60% of its items' and collates' time in the collector (its own
    process none) gets a caveat saying so, by the same rule as the process's (at least GC_HIGH,
    more than the fast one's); at 5%, or without workers (the step's own figure then holds the
    same collections), none."""
    from workbook_lib.results.timing import GC_PAUSE, ArmResult, LoopStudy

    def arm(name, collate_gc):
        extra = {GC_PAUSE: Stat.from_samples([0.0] * 4),
                 f"{GC_PAUSE}:worker_collate": Stat.from_samples(collate_gc),
                 f"{GC_PAUSE}:worker_fetch": Stat.from_samples([0.0] * 4),
                 "worker_collate": Stat.from_samples([0.09, 0.1, 0.1, 0.11]),
                 "worker_fetch": Stat.from_samples([0.0] * 4)}
        return ArmResult(name=name, strategy=name, variant="full", mode="full", batch_size=8,
                         micro_batches=1, step=Stat.from_samples([0.05] * 4), extra=extra)

    def study(slow_gc, workers=2):
        return LoopStudy(device="cpu", sizes="", strategies=["slow", "fast"], batch_sizes={},
                         interleaved=False, settings={"num_workers": workers},
                         arms={"slow/full": arm("slow", slow_gc),
                               "fast/full": arm("fast", [0.0] * 4)})

    heavy = [0.05, 0.06, 0.07, 0.06]
    note = V.gc_note(study(heavy), "slow", "fast")
    assert note.startswith("In the 2 DataLoader worker process(es) of 'slow', Python's garbage "
                           "collector took 60% of its data items' and collates' summed time (at "
                           "most 70 ms in one step's batch, of 4 steps), against 0% in those of "
                           "'fast'"), note
    assert "gc.freeze()" in note and "other pipelines" not in note
    # a forked worker walks what it inherited from the training process (a review)
    assert note.endswith("a forked DataLoader worker's the ones it inherited from the training "
                         "process too"), note
    assert V.gc_note(study([0.005] * 4), "slow", "fast") == ""
    assert V.gc_note(study(heavy, workers=0), "slow", "fast") == ""


def test_a_stage_whose_time_is_mostly_the_garbage_collector_is_told_so():
    """stage_gc_share: the collector's part of a cause's stage (the data stages: of the item's or
    the collate's own time, where it ran) in the slow pipeline's full steps; a named cause at or
    above GC_MOST gets the collector's advice after its own, one below does not, and a record
    without the figure gets none."""
    from workbook_lib.results.timing import GC_PAUSE, ArmResult
    from workbook_lib.results.verdict import Cause
    from workbook_lib.studies.verdict.advice import GC_MOST, advise
    from workbook_lib.studies.verdict.causes import stage_gc_share

    def arm(collate_gc, fetch_gc=(0.0,) * 4):
        extra = {GC_PAUSE: Stat.from_samples([sum(x) for x in zip(collate_gc, fetch_gc)]),
                 f"{GC_PAUSE}:worker_collate": Stat.from_samples(list(collate_gc)),
                 f"{GC_PAUSE}:worker_fetch": Stat.from_samples(list(fetch_gc)),
                 "worker_collate": Stat.from_samples([0.16, 0.17, 0.18, 0.17]),
                 "worker_fetch": Stat.from_samples([0.01] * 4)}
        return ArmResult(name="slow", strategy="slow", variant="full", mode="full",
                         batch_size=8, micro_batches=1, step=Stat.from_samples([0.2] * 4),
                         stages={"loader_wait": Stat.from_samples([0.17, 0.18, 0.19, 0.18]),
                                 "forward": Stat.from_samples([0.02] * 4)},
                         extra=extra)

    heavy, light = arm([0.11, 0.12, 0.13, 0.12]), arm([0.01, 0.0, 0.02, 0.0])
    assert stage_gc_share(heavy, "collate") == pytest.approx(0.48 / 0.68)
    assert stage_gc_share(heavy, "data_item") == 0.0  # the items collected nothing
    assert stage_gc_share(arm([0.0] * 4, [0.005] * 4), "data_item") == pytest.approx(0.5)
    assert stage_gc_share(heavy, "forward") == 0.0
    assert stage_gc_share(light, "collate") == pytest.approx(0.03 / 0.68)
    assert stage_gc_share(light, "collate") < GC_MOST
    old = arm([0.0] * 4)
    old.extra = {}
    assert stage_gc_share(old, "collate") is None
    # a results file that recorded the step's collector but not the data stages' own
    main_only = arm([0.11, 0.12, 0.13, 0.12])
    main_only.extra = {k: v for k, v in main_only.extra.items() if ":worker" not in k}
    assert stage_gc_share(main_only, "collate") is None
    assert stage_gc_share(main_only, "forward") == 0.0

    def advised(share):
        c = Cause("collate", "", 10.0, 1.0, 9.0, 0.9, "measured", effect="adds",
                  stage="collate", gc_share=share)
        advise([c], "cpu")
        return c.advice
    assert advised(0.71).startswith("make the collate cheap") and \
        "; 71% of the collates' own time (in the process that ran them) in the slow " \
        "pipeline's full steps was Python's garbage " \
        "collector: make fewer Python objects per step" in advised(0.71)
    assert "garbage collector" not in advised(0.04)
    assert "garbage collector" not in advised(None)
