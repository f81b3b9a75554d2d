"""The cost model (held-out sizes kept out of every fit) and every claim's rule, both ways."""
import pytest
import torch

from workbook_lib.studies.verdict import claims as C
from workbook_lib.studies.mask_cost import costmodel as cm
from workbook_lib import traces as ta
from workbook_lib.measurement.timing import Stat
from workbook_lib.results.mask_cost import SweepPoint
from conftest import write_trace


def st(median, spread=0.0, n=10):
    """A Stat whose samples spread +-spread around median."""
    if spread == 0:
        return Stat.from_samples([median] * n)
    return Stat.from_samples([median - spread, median, median + spread] * (n // 3 + 1))


def _points(true, noise=0.0):
    g = torch.Generator().manual_seed(0)

    def n(v):
        return v * (1 + noise * float(torch.randn(1, generator=g)))
    pts = []
    for e in (1000, 2000, 4000, 8000):
        pts.append(SweepPoint("keep_mask", e, 0, 0.0, st(n(true["gamma"] * e + 1e-6))))
        for p in (0.1, 0.5):
            pts.append(SweepPoint("gather", e, 0, p, st(n(true["delta"] * e + 1e-6))))
        for h in (8, 16, 32):
            un = true["beta"] * e * h + true["beta_e"] * e + true["c"]
            mask = true["alpha_eh"] * e * h
            pts.append(SweepPoint("unmasked", e, h, 0.0, st(n(un))))
            pts.append(SweepPoint("masked", e, h, 0.01, st(n(un + mask))))
            pts.append(SweepPoint("mask_cost", e, h, 0.01, st(n(mask))))
            for p in (0.01, 0.5):
                f = (true["gamma"] + true["delta"]) * e + (1 - p) * (
                    true["beta"] * e * h + true["beta_e"] * e) + true["c"]
                pts.append(SweepPoint("filter_layer", e, h, p, st(n(f))))
    return pts


TRUE = {"beta": 1e-10, "beta_e": 2e-9, "alpha_eh": 5e-11, "gamma": 3e-9, "delta": 1e-9,
        "c": 1e-5}


def test_fit_recovers_coefficients_and_holds_out_the_largest_e():
    m = cm.fit(_points(TRUE))
    assert m.held_out_edges == 8000
    for name in ("beta", "beta_e"):
        assert m.beta.coefficients[name] == pytest.approx(TRUE[name], rel=1e-6)
    assert m.alpha_carrier == "E*H"
    assert m.alpha.coefficients["alpha_eh"] == pytest.approx(TRUE["alpha_eh"], rel=1e-6)
    assert m.gamma.coefficients["gamma"] == pytest.approx(TRUE["gamma"], rel=1e-6)
    for f in (m.beta, m.alpha, m.gamma, m.delta):
        assert f.in_fit_points > 0 and f.held_out_points > 0
        assert f.held_out_median_abs_rel < 1e-6
    assert m.filter_check.held_out_median_abs_rel < 1e-6


def test_held_out_points_change_no_coefficient():
    pts = _points(TRUE)
    base = cm.fit(pts)
    wild = [SweepPoint(p.kind, p.E, p.H, p.p, st(p.stat.median * 7)) if p.E == 8000 else p
            for p in pts]
    m = cm.fit(wild)
    assert m.beta.coefficients == base.beta.coefficients  # 8000 is in no fit
    assert m.gamma.coefficients == base.gamma.coefficients
    assert m.beta.held_out_median_abs_rel == pytest.approx(6 / 7)  # shows as a held-out miss


def test_negative_coefficient_is_reported_not_clipped():
    true = dict(TRUE, beta_e=-5e-9, c=1e-3)
    m = cm.fit(_points(true))
    assert m.beta.coefficients["beta_e"] < 0 and "beta_e" in m.beta.negative


def test_standard_errors_follow_the_scatter_of_the_points():
    exact, noisy = cm.fit(_points(TRUE)), cm.fit(_points(TRUE, noise=0.2))
    assert exact.beta.rel_stderr("beta_e") < 1e-6  # a perfect line: no uncertainty
    assert noisy.beta.rel_stderr("beta_e") > 0.05  # 20% scatter: a loose coefficient
    assert noisy.beta.rel_stderr("beta") < noisy.beta.rel_stderr("beta_e")  # E*H spans more
    assert exact.gamma.point_noise == 0.0


def test_stability_says_why_a_coefficient_differs():
    from workbook_lib.tools.headlines import FITTED, Figure
    from workbook_lib.tools.stability import _fitted_note

    def fig(v, se, noise):
        return Figure("beta_e", "cost model beta_e", "02", v, None, None, "s/edge", "lower",
                      FITTED, se, noise)
    loose = _fitted_note([fig(1.0, 0.4, 0.05), fig(1.6, 0.4, 0.05)], 0.05, 0.15)
    assert "within two standard errors" in loose
    drift = _fitted_note([fig(1.0, 0.01, 0.05), fig(1.3, 0.01, 0.05)], 0.25, 0.15)
    assert "machine's drift" in drift and "within two" not in drift
    disturbed = _fitted_note([fig(1.0, 0.01, 0.3), fig(3.0, 0.01, 0.05)], 0.1, 0.15)
    assert "disturbed" in disturbed
    unexplained = _fitted_note([fig(1.0, 0.01, 0.05), fig(3.0, 0.01, 0.05)], 0.1, 0.15)
    assert unexplained.endswith("drift. The verdict uses ratios, not coefficients")


def test_crossover_formula_and_direct_check():
    m = cm.fit(_points(TRUE))
    h = 16
    p = m.crossover_p(h)
    e = 1e6
    assert m.predict_filter(e, h, p) == pytest.approx(m.predict_mask(e, h), rel=1e-9)
    checks = cm.crossover_checks(m, _points(TRUE))
    assert checks and all(c.agrees for c in checks)


def test_small_sweep_runs_interleaved():
    cfg = cm.SweepConfig(num_nodes=50, edges=[200, 400], hidden=[4], p=[0.1],
                         device=torch.device("cpu"), warmup=0, min_rounds=2, max_time_s=1)
    kinds = {p.kind for p in cm.sweep(cfg)}
    assert kinds == {"keep_mask", "gather", "masked", "unmasked", "spmm", "filter_layer",
                     "mask_cost"}


# ------------------------------------------------------------------ claim rules
def test_rules_go_both_ways():
    assert C.within_band(st(50, 2), 56) == C.HELD
    assert C.within_band(st(13.2, 0.5), 56) == C.FAILED  # 13.2x does not "hold" 56x
    assert C.within_band(st(28, 3), 56) == C.NOISE  # the IQR straddles the band's edge
    assert C.near(67.9e6, 65e6, 0.1) == C.HELD and C.near(67.9e6, 130e6, 0.1) == C.FAILED
    assert C.above(st(1.5, 0.1), 1) == C.HELD and C.above(st(0.5, 0.1), 1) == C.FAILED
    assert C.changes_nothing(st(1.0, 0.05)) == C.HELD
    assert C.changes_nothing(st(0.66, 0.02)) == C.FAILED  # faster with the gather: a change
    assert C.changes_nothing(st(1.03, 0.01)) == C.HELD  # a precise 3% is no change worth naming
    assert C.changes_nothing(st(1.06, 0.09)) == C.NOISE  # straddles the 10% edge


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _inventory(mask_bytes_per_edge=1.0, incidence_scale=1.0):
    from workbook_lib.results.inventory import RealSize

    e, n, t = 242_337, 6607, 9
    rs = RealSize(2_423_370, 2_423_370, 28 * 2_423_370, 2_423_370 * 332313,
                  (2 * 2_423_370 + t * (n + 1)) * 8, (2 * 2_423_370 + t * (n + 1)) * 4, 332313)
    return _Obj(real_size=rs, total_edges=e, scale=0.1, num_genes=n, edge_types=[0] * t,
                measured_batch_mask_bytes_per_sample=mask_bytes_per_edge * e,
                measured_incidence_cache_bytes=int((2 * e * 8 * incidence_scale)
                                                   + t * (n + 1) * 8))


def _statuses(claims):
    return {c.key: c.status for c in claims}


def _dual(factor):
    from workbook_lib.results.mask_cost import DualForwardMasks

    return DualForwardMasks("replicated_mask_cpu", 2, 12117, 24234, int(24234 * factor))


def test_size_claims_both_ways():
    held = _statuses(C.size_claims(_inventory(), _dual(1.0)))
    assert held["masks_per_batch"] == C.HELD and held["mask_per_sample"] == C.HELD
    assert held["mask_storage"] == C.HELD  # 2.42 MB x 332,313 samples: about 805 GB
    assert held["masks_dual_forward"] == C.FAILED  # the wildtype pass reads no mask
    assert held["incidence_cache"] == C.HELD  # both endpoints at 4 bytes: about 19 MB
    # a pipeline that carried twice the mask bytes, a dual pass that reads masks too, and a
    # cache of half the entries (one endpoint)
    other = _statuses(C.size_claims(_inventory(mask_bytes_per_edge=2.0, incidence_scale=0.5),
                                    _dual(1.0)))
    assert other["masks_per_batch"] == C.FAILED and other["incidence_cache"] == C.FAILED
    assert other["mask_per_sample"] == C.FAILED and other["mask_storage"] == C.FAILED
    assert _statuses(C.size_claims(_inventory(), _dual(2.0)))["masks_dual_forward"] == C.HELD
    assert _statuses(C.size_claims(_inventory()))["masks_dual_forward"] == C.NOT_MEASURED


def test_dual_forward_probe_reads_what_the_forward_reads():
    """The probe counts the per-edge tensors an operator reads: a wildtype pass that multiplies
    by masks of its own shows as more bytes, one that reads none as the same."""
    from workbook_lib.studies.mask_cost.forward_masks import mask_bytes_read

    class G:
        edge_types = ["a"]

        def num_edges(self, t):
            return 5

    class S:
        graph = G()

    class M:
        def __call__(self, strategy, ctx, dual=False):
            out = (ctx["x"] * ctx["mask"].unsqueeze(-1)).sum()  # [E, H] messages x mask
            if dual and ctx["wt_mask"]:
                out = out + (ctx["x"] * ctx["mask"].clone().unsqueeze(-1)).sum()
            elif dual:
                out = out + ctx["x"].sum()
            return out
    ctx = {"x": torch.ones(10, 3), "mask": torch.ones(10, dtype=torch.bool), "wt_mask": True}
    assert mask_bytes_read(S(), M(), ctx, 2, dual=False) == 10
    assert mask_bytes_read(S(), M(), ctx, 2, dual=True) == 20
    ctx["wt_mask"] = False
    assert mask_bytes_read(S(), M(), ctx, 2, dual=True) == 10


def _mask_cost(err=1e-7, filter_over_mask=1.3):
    pts = [SweepPoint("masked", 1000, 32, 0.01, Stat.from_samples([1.0, 1.01, 0.99])),
           SweepPoint("filter_layer", 1000, 32, 0.001,
                      Stat.from_samples([filter_over_mask, filter_over_mask * 1.01,
                                         filter_over_mask * 0.99]))]
    return _Obj(exact={"node_mask_shared": err, "replicated_mask_cpu": 1e-7},
                exact_graph="g", cost=_Obj(points=pts), memory=_Obj(fits={}))


def test_cost_claims_both_ways():
    assert _statuses(C.cost_claims(_mask_cost(), 32)) == {"exact": C.HELD,
                                                           "filter_vs_mask": C.HELD}
    assert _statuses(C.cost_claims(_mask_cost(err=1e-2, filter_over_mask=0.6), 32)) == {
        "exact": C.FAILED, "filter_vs_mask": C.FAILED}


def _timing(data_ratio=56.0, dm_ratio=19.0, model_ratio=1.6, per_gene_syncs=1.0, vec_syncs=0.0,
            optimizer_share=0.02, summed_optimizer=0.24, h2d_top=False, loop_ratio=1.0,
            stages_ratio=None):
    from workbook_lib.results.timing import ReportedFigure, SyncPoint
    from workbook_lib.measurement.profiling import ProfileResult

    figs = [ReportedFigure("data_only_ratio", "d", 56, st(data_ratio, 0.01 * data_ratio), "x"),
            ReportedFigure("data_model_ratio", "dm", 19, st(dm_ratio, 0.01 * dm_ratio), "x"),
            ReportedFigure("model_batch_ratio", "m", 1.6, st(model_ratio, 0.01), "x")]
    if stages_ratio is not None:
        figs.append(ReportedFigure("data_stages_ratio", "s", 56,
                                   st(stages_ratio, 0.01 * stages_ratio), "x"))
    stages = {"h2d": st(5.0 if h2d_top else 0.1), "forward": st(1.0), "backward": st(2.0)}
    arm = _Obj(stages=stages, step=st(8.0 if h2d_top else 3.1))
    strategies = ["replicated_mask_cpu", "replicated_mask_stored", "dango_wildtype",
                  "device_mask_loop",
                  "device_mask_vectorized"]
    loops = _Obj(strategies=strategies, arm=lambda n, m="full": arm,
                 ratio=lambda a, b: st(loop_ratio, 0.05))
    # the real count's structure at B = 4, k = 3, T = 9 (108 (sample, gene, type) triples)
    syncs = _Obj(scaling=[SyncPoint(4, 3, 9, int(per_gene_syncs * 108), 0),
                          SyncPoint(8, 3, 9, int(per_gene_syncs * 216), 0)],
                 per_step={"device_mask_vectorized": vec_syncs}, method="m")
    # a real trace's shape: the ProfilerStep roots are 24% of every duration summed
    prof = ProfileResult({"wait": 1, "warmup": 1, "active": 2}, "steps 3-4", 1.0,
                         {"optimizer": optimizer_share, "forward": 1 - optimizer_share},
                         {"forward": 2.9, "optimizer": 0.1}, "t.json",
                         summed={"optimizer": summed_optimizer, "backward": 0.2,
                                 "other": 0.8 - summed_optimizer})
    return _Obj(loops=loops, syncs=syncs, profiles={"replicated_mask_cpu": prof},
                figure=lambda k: next((f for f in figs if f.key == k), None))


def test_timing_claims_both_ways():
    held = _statuses(C.timing_claims(_timing(h2d_top=True), "cuda"))
    assert held == {"transfer_bottleneck": C.HELD, "data_only_ratio": C.HELD,
                    "data_model_ratio": C.HELD, "model_batch_ratio": C.HELD,
                    "mask_loop_syncs": C.HELD, "vectorize_no_gain": C.HELD,
                    "stored_masks_no_gain": C.HELD, "optimizer_24": C.FAILED,
                    "nested_sum": C.HELD}
    failed = _statuses(C.timing_claims(_timing(
        data_ratio=13.2, dm_ratio=4.0, model_ratio=22.0, per_gene_syncs=2.11, vec_syncs=3.0,
        optimizer_share=0.24, summed_optimizer=0.6, loop_ratio=1.6), "cuda"))
    assert all(v == C.FAILED for k, v in failed.items() if k != "optimizer_24"), failed
    assert failed["optimizer_24"] == C.HELD  # the 24% is real: then the sum explains nothing
    # the summation gives about 24% but so does the exclusive time: not an artefact
    assert _statuses(C.timing_claims(_timing(optimizer_share=0.24), "cuda"))["nested_sum"] \
        == C.FAILED


def test_data_only_claim_judges_the_data_stages_not_the_harness():
    # the whole data-only step reads 7.5x, its data stages 50x: the claim follows the stages
    got = {c.key: c for c in C.timing_claims(_timing(data_ratio=7.5, stages_ratio=50.0), "cuda")}
    assert got["data_only_ratio"].status == C.HELD and got["data_only_ratio"].value == 50.0
    got = {c.key: c for c in C.timing_claims(_timing(data_ratio=56.0, stages_ratio=10.0), "cuda")}
    assert got["data_only_ratio"].status == C.FAILED


def test_gpu_only_claims_are_not_measured_on_a_cpu_with_their_reason():
    cpu = {c.key: c for c in C.timing_claims(_timing(), "cpu", scale=0.1)}
    for key in ("transfer_bottleneck", "data_only_ratio", "model_batch_ratio",
                "vectorize_no_gain"):
        assert cpu[key].status == C.NOT_MEASURED and cpu[key].note, key
    assert "host-to-device" in cpu["data_only_ratio"].note
    assert "sync costs nothing" in cpu["vectorize_no_gain"].note
    assert "kernel efficiency" in cpu["model_batch_ratio"].note
    # what a CPU can measure keeps a status, marked as measured at a reduced size
    assert cpu["data_model_ratio"].status == C.HELD and "scale 0.1" in cpu["data_model_ratio"].size
    assert cpu["mask_loop_syncs"].status == C.HELD


def test_mask_loop_rule_compares_with_864_scaled():
    assert C.mask_loop_status([1.0, 1.1]) == C.HELD
    assert C.mask_loop_status([2.11, 2.2]) == C.FAILED  # two syncs per gene and type
    assert C.mask_loop_status([1.0, 2.0]) == C.NOISE


def test_investigation_summation_counts_profiler_steps_as_the_optimizer(tmp_path):
    from workbook_lib.measurement import profiling as pr

    ev = [("ProfilerStep#1", 0, 100, 1), ("wb:forward", 10, 40, 1), ("aten::addmm", 14, 20, 1),
          ("wb:backward", 50, 40, 1), ("AddmmBackward0", 52, 30, 1),
          ("Optimizer.step#AdamW.step", 92, 6, 1), ("aten::add_", 93, 2, 1)]
    sums = pr.investigation_sums(ta.load_trace(write_trace(tmp_path, ev)))
    assert sums["optimizer"] == pytest.approx(106e-6)  # the whole step and the real optimizer
    assert sums["backward"] == pytest.approx(30e-6) and "forward" not in sums  # wb: left out
    assert sums["other"] == pytest.approx(22e-6)


def _ddp(total=40.0, steps=2.29, per_step=17.5, factor=1.0, factor_noise=0.05, gather=1.0):
    from workbook_lib.studies.ddp.summary import within_noise
    from workbook_lib.results.ddp import GapDecomposition

    f = st(factor, factor_noise)
    g = GapDecomposition("a", "b", {"a": 28, "b": 64}, 2, 1, steps, st(per_step, 0.5), f,
                         within_noise(f), st(total, 1.0))
    return _Obj(gap=g, worlds={1: None, 2: _Obj(gather_ratio=st(gather, 0.02))})


def _bench(lazy_per_sample, wildtype_per_sample, full=True):
    from workbook_lib.results.bench import PerSample

    def steps(v, b):
        return Stat.from_samples([v * b * x for x in (0.95, 1.0, 1.05)])
    return _Obj(full_size=full,
                steps={"replicated_gather_scatter": steps(lazy_per_sample, 2),
                       "wildtype": steps(wildtype_per_sample, 64)},
                per_sample_s={"replicated_gather_scatter": PerSample(lazy_per_sample, 0, 3, 2),
                              "wildtype": PerSample(wildtype_per_sample, 0, 3, 64)})


def test_epoch_gap_is_judged_at_the_real_spec_when_the_bench_ran_there():
    d = _ddp(total=40.0, steps=20.0, per_step=2.0)  # 40x at the run's reduced scale
    real = {c.key: c for c in C.ddp_claims(d, _bench(1.258, 0.00344), scale=0.1)}["epoch_gap"]
    assert real.status == C.FAILED and real.value == pytest.approx(1.258 / 0.00344, rel=0.01)
    assert real.size == C.REAL_SIZE
    near = {c.key: c for c in C.ddp_claims(d, _bench(0.138, 0.00344))}["epoch_gap"]
    assert near.status == C.HELD
    small = {c.key: c for c in C.ddp_claims(d, _bench(1.258, 0.00344, full=False),
                                             scale=0.1)}["epoch_gap"]
    assert small.status == C.HELD and "reduced size (scale 0.1)" in small.size


def test_ddp_claims_both_ways():
    held = _statuses(C.ddp_claims(_ddp(total=40.0, steps=20.0, per_step=2.0, factor=1.0)))
    assert held == {"epoch_gap": C.HELD, "ddp_and_batch_explain": C.HELD,
                    "gather_changes_nothing": C.HELD}
    failed = _statuses(C.ddp_claims(_ddp(total=83.0, steps=2.29, per_step=36.0, factor=1.0,
                                         gather=0.66)))
    assert failed == {"epoch_gap": C.FAILED, "ddp_and_batch_explain": C.FAILED,
                      "gather_changes_nothing": C.FAILED}


def test_memory_claim_not_measured_on_cpu_and_both_ways_on_gpu():
    from workbook_lib.measurement.memory import MemoryFit

    assert C.memory_claims(_mask_cost(), "cpu")[0].status == C.NOT_MEASURED

    def mc(largest):
        f = MemoryFit("x", per_sample_bytes=2e9, largest_batch=largest, budget_bytes=80e9,
                      extrapolation_factor=10.0)
        return _Obj(memory=_Obj(fits={"replicated_mask_cpu:gather_scatter @ scale 1, H=64, "
                                      "L=3": f}))
    assert C.memory_claims(mc(39), "cuda")[0].status == C.HELD
    assert C.memory_claims(mc(400), "cuda")[0].status == C.FAILED


