"""What the process got of the CPUs while it was timed (issue: a busy machine that looks quiet).

The contention rule is driven both ways with realistic figures and with a real CPU-bound helper
process pinned to the same CPU as the timed work, started and stopped by the test; the CPUs a
process may use are read from fake cgroup trees and SLURM variables; a verdict built on contended
figures names them and does not rest on them. No absolute time is asserted.
"""
import os
import subprocess
import sys
import time

import pytest
import torch

from workbook_lib.measurement import cpu as C
from workbook_lib.measurement.timing import Stat, StepClock, measure

LINUX = sys.platform.startswith("linux") and hasattr(os, "sched_setaffinity")


def share(run, wait, cpu=None, wall=1.0, threads=1, pressure=None):
    """A CpuShare of one second of wall time."""
    return C.CpuShare(wall_s=wall, cpu_s=run if cpu is None else cpu, threads=threads,
                      allowed=2, intervals=10, run_s=run, wait_s=wait, pressure_s=pressure)


def test_the_rule_flags_a_share_below_80_percent_and_not_above():
    # a serial step alone: one of two threads busy, no run-queue wait -> got 100%, not flagged
    alone = share(run=0.98, wait=0.01, threads=2)
    assert alone.got == pytest.approx(0.98 / 0.99) and alone.use == pytest.approx(0.49)
    assert not alone.contended
    # the same step beside a hog on its CPU: half of its asked time was spent waiting
    hog = share(run=0.50, wait=0.48, threads=2, pressure=0.95)
    assert hog.contended and hog.got == pytest.approx(0.50 / 0.98)
    assert hog.pressure == pytest.approx(0.95) and "contended" in hog.describe()
    # the edge: 81% is not contended, 79% is
    assert not share(run=0.81, wait=0.19).contended and share(run=0.79, wait=0.21).contended
    # no schedstat: CPU use over wall x threads is ruled on instead, and the rule says so
    fallback = C.CpuShare(wall_s=1.0, cpu_s=0.7, threads=1, allowed=1, intervals=3)
    assert fallback.got is None and fallback.contended and "no per-thread" in fallback.rule
    assert not C.CpuShare(wall_s=1.0, cpu_s=0.95, threads=1, allowed=1, intervals=3).contended
    assert "not available here" in fallback.describe()  # no pressure: said, not guessed


def test_derived_figures_carry_the_worse_share():
    quiet, busy = share(0.97, 0.01), share(0.4, 0.6)
    a = Stat.from_samples([1.0, 1.1, 1.2]).with_cpu(quiet)
    b = Stat.from_samples([2.0, 2.1, 2.2]).with_cpu(busy)
    assert not a.contended and b.contended
    assert a.ratio_to(b).contended and a.ratio_to(b, paired=True).contended
    assert a.scaled(1e3, "ms").cpu is quiet and b.inverse("it/s").contended
    assert not a.ratio_to(a).contended and a.times(b).contended
    assert "contended: got 40%" in b.describe()
    # through JSON and back, as the verdict reads it
    back = Stat.from_json(b.to_json())
    assert back.contended and back.cpu.got == pytest.approx(0.4)


def test_allowed_cpus_reads_affinity_cgroup_quota_and_slurm(tmp_path):
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    # cgroup v2: 1.5 CPUs of quota -> 1 thread at full speed
    proc.write_text("0::/job/step\n")
    (root / "job" / "step").mkdir(parents=True)
    (root / "job" / "step" / "cpu.max").write_text("max 100000\n")
    (root / "job" / "cpu.max").write_text("150000 100000\n")
    a = C.allowed_cpus(proc_cgroup=proc, cgroup_root=root, environ={}, affinity=8)
    assert a.quota == pytest.approx(1.5) and a.cpus == 1 and a.source == "cgroup CPU quota"
    # cgroup v1 without a quota (-1): the affinity decides; SLURM tighter still
    proc.write_text("3:cpu,cpuacct:/slurm\n")
    (root / "cpu,cpuacct" / "slurm").mkdir(parents=True)
    (root / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us").write_text("100000\n")
    a = C.allowed_cpus(proc_cgroup=proc, cgroup_root=root, environ={}, affinity=3)
    assert a.quota is None and a.cpus == min(3, os.cpu_count()) and a.affinity == 3
    a = C.allowed_cpus(proc_cgroup=proc, cgroup_root=root,
                       environ={"SLURM_CPUS_PER_TASK": "2"}, affinity=3)
    assert a.cpus == min(2, os.cpu_count()) and a.slurm == 2
    # a v1 quota of 4 CPUs
    (root / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us").write_text("400000\n")
    a = C.allowed_cpus(proc_cgroup=proc, cgroup_root=root, environ={}, affinity=64)
    assert a.quota == pytest.approx(4.0) and a.cpus == min(4, os.cpu_count())


def test_threads_fit_the_cpus_with_workers_and_ranks():
    four = C.CpuAllowance(cpus=4, source="os.sched_getaffinity", host=16, affinity=4)
    assert C.fit_threads(requested=16, allowance=four).threads == 4
    assert C.fit_threads(requested=2, allowance=four).threads == 2  # never raised
    fit = C.fit_threads(requested=16, workers=2, allowance=four)
    assert fit.threads == 2 and "2 DataLoader worker" in fit.why and "of 16 asked" in fit.why
    assert C.fit_threads(requested=16, procs=2, workers=1, allowance=four).threads == 1
    assert C.fit_threads(requested=16, procs=8, allowance=four).threads == 1  # at least 1
    with pytest.raises(ValueError, match="'procs'"):
        C.fit_threads(procs=0, allowance=four)


def test_pressure_is_read_where_the_kernel_has_it_and_none_elsewhere(tmp_path):
    f = tmp_path / "cpu"
    f.write_text("some avg10=1.00 avg60=2.00 avg300=3.00 total=123456\n"
                 "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert C.read_pressure(f) == 123456.0
    assert C.read_pressure(tmp_path / "absent") is None


# --- a real CPU hog on the same CPU --------------------------------------------------------------


def _idlest_cpu() -> int:
    """The allowed CPU with the most idle time over a short window (other jobs may share the
    machine: the test's "alone" timing should be as alone as the machine allows)."""
    allowed = sorted(os.sched_getaffinity(0))

    def idle():
        out = {}
        with open("/proc/stat") as fh:
            for line in fh:
                name = line.split()[0]
                if name.startswith("cpu") and name[3:].isdigit():
                    out[int(name[3:])] = int(line.split()[4])
        return out
    a = idle()
    time.sleep(0.3)
    b = idle()
    return max(allowed, key=lambda c: b.get(c, 0) - a.get(c, 0))


def _work():
    x = torch.randn(256, 256)
    for _ in range(20):
        x = torch.tanh(x @ x * 1e-3)
    return x


def _timed(steps=25) -> Stat:
    """A loop's timing: steps of CPU-bound work in a StepClock (single thread)."""
    clock = StepClock("cpu")
    _work()
    for _ in range(steps):
        with clock.step(timed=True):
            _work()
    return clock.wall()


@pytest.fixture
def one_cpu():
    """This test's thread pinned to one CPU with one torch thread; restored afterwards."""
    if not LINUX:
        pytest.skip("needs Linux CPU affinity")
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cpu = _idlest_cpu()
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


def _hog(cpu: int) -> subprocess.Popen:
    """A CPU-bound helper process pinned to ``cpu``."""
    code = (f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('ready', flush=True)\n"
            "while True: pass")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_timing_beside_a_cpu_hog_is_contended_and_alone_is_not(one_cpu):
    hog = _hog(one_cpu)
    try:
        time.sleep(0.2)
        beside = _timed()
    finally:
        hog.kill()
        hog.wait()
    assert beside.contended, beside.cpu.describe()
    assert beside.cpu.judged < C.CONTENDED_BELOW
    # alone: the same timing. The machine may be shared with other jobs (then this process's
    # CPU is contended by them, which the figure rightly says): up to three tries, and a skip
    # that names the machine's load when none of them ran alone
    tries = []
    for _ in range(3):
        alone = _timed()
        tries.append(alone.cpu)
        if not alone.contended:
            break
    else:
        load = os.getloadavg()[0]
        # others waited for a CPU (this pinned thread alone adds no pressure), or no way to tell
        busy = [c for c in tries if c.pressure is None or c.pressure > 0.3]
        if len(busy) == len(tries):
            pytest.skip(f"the machine is busy with other jobs (load {load:.1f}; "
                        + "; ".join(c.describe() for c in tries) + ")")
    assert not alone.contended, alone.cpu.describe()
    # what the hog took is visible in the figures, not just in the flag
    assert alone.cpu.judged > beside.cpu.judged


def test_measure_records_the_share_too(one_cpu):
    hog = _hog(one_cpu)
    try:
        time.sleep(0.2)
        st = measure(_work, min_repeats=5, max_time_s=0.3)
    finally:
        hog.kill()
        hog.wait()
    assert st.cpu is not None and st.cpu.intervals == 1 and st.contended, st.cpu.describe()


def test_a_verdict_built_on_contended_figures_names_them_and_does_not_rest_on_them(tmp_path):
    from test_verdict_compare import _Obj, _ddp, _mask_cost, _timing

    from workbook_lib.analysis import verdict as V

    busy = share(run=0.3, wait=0.7, threads=2, pressure=0.9)
    inv = _Obj(scale=0.1, total_edges=242337)

    def verdict(contended: bool):
        from workbook_lib.report import verdict_view as view

        t, ddp = _timing(), _ddp()
        if contended:  # steady contention: the IQRs stay small, the CPU share does not
            for a in t.loops.arms.values():
                a.step.with_cpu(busy)
        rec = V.recommend(t, _mask_cost(), ddp, tmp_path, baseline="replicated_mask_cpu",
                          tie_tolerance=0.15, num_samples=1000)
        g = V.measure_gap(t.loops, "replicated_mask_cpu", "dango_wildtype", 1000, ddp)
        causes = V.rank_causes(t, g.slow, g.fast, g, "cpu")
        v = V.VerdictResult("", "cpu", "cpu", causes, [], rec, g.ratio, [], [],
                            disturbed=V.disturbed_figures(g, rec, 0.10),
                            contended=V.contended_figures(g, rec, t), gap=g,
                            gap_strategies=[g.slow, g.fast])
        view.compose(v, inv.scale, inv.total_edges)
        return v
    quiet = verdict(False)
    assert quiet.contended == {} and quiet.disturbed == {}
    assert quiet.answer.startswith("**Replicated masks") and "first cause:" in quiet.lead
    assert "**The fix: " in quiet.answer and not quiet.recommendation.contended
    assert not any("Contended" in c for c in quiet.caveats)
    loud = verdict(True)
    assert loud.disturbed == {}  # precise figures: only the CPU share tells
    assert set(loud.contended) == {"gap", "per_step_ratio", "speedup", "loop"}
    assert "contended, not relied on" in loud.lead  # the gap is marked where it is quoted
    line = next(c for c in loud.caveats if c.startswith("Contended, not relied on"))
    assert "the epoch-time gap" in line and "30%" in line
    assert "**The fix, provisionally: " in loud.answer
    assert "provisional" in loud.recommendation.tie_rule
    # and through JSON, as notebook 05 writes it and compare/stability read it
    back = V.VerdictResult.from_json(loud.to_json())
    assert back.contended["gap"].got == pytest.approx(0.3)
    assert back.gap.ratio.median == pytest.approx(loud.gap.ratio.median)


def test_selftest_says_the_machine_is_busy_beside_a_hog(one_cpu):
    from workbook_lib.running import selftest

    hog = _hog(one_cpu)
    try:
        time.sleep(0.2)
        busy = selftest.check_cpu_share(torch.device("cpu"))
    finally:
        hog.kill()
        hog.wait()
    assert busy.status == selftest.BUSY and "contended" in busy.detail, busy.detail
    assert "compute thread(s) per process" in busy.detail
    assert "busy" in selftest.format_table([busy], "cpu")


def test_compare_and_stability_mark_a_contended_figure_and_do_not_judge_it(tmp_path,
                                                                           monkeypatch):
    from workbook_lib.analysis import compare as cmp
    from workbook_lib.analysis import stability as stab
    from workbook_lib.analysis.headlines import RATIO, Figure

    def fig(v, cpu=None):
        return Figure("per_step_ratio_03", "per-step ratio", "03", v, 0.05 * v, None, "x",
                      "lower", RATIO, cpu=cpu)
    quiet, busy = share(0.97, 0.01), share(0.3, 0.7)
    # 10x apart with small IQRs: judged when both ran alone, not when one was contended
    assert cmp._verdict(fig(2.0, quiet), fig(20.0, quiet))[1] == "worse"
    text, cls = cmp._verdict(fig(2.0, quiet), fig(20.0, busy))
    assert cls == "" and "contended: not compared" in text
    assert "contended" in cmp._cell(fig(20.0, busy)) and "contended" not in cmp._cell(fig(2.0))
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for d in runs:
        d.mkdir()
    figs = {runs[0]: fig(2.0, quiet), runs[1]: fig(20.0, busy)}
    monkeypatch.setattr(stab, "headline_figures", lambda d: {"per_step_ratio_03": figs[d]})
    res = stab.compare_figures(runs)
    row = res.rows[0]
    assert row.agrees is None and row.note.startswith("contended in run2")
    assert row.values[1].endswith("(contended)") and res.disagreeing == []
    assert "CONTENDED" in stab.page(res) and "not judged" in stab.page(res)
    figs[runs[1]] = fig(20.0, quiet)  # the same difference measured alone: it differs
    assert stab.compare_figures(runs).rows[0].agrees is False


def test_the_cpu_table_names_each_arm_once_the_pipelined_step_apart_from_the_full_step():
    from workbook_lib.analysis.timing_study import PIPELINED, LoopStudy
    from workbook_lib.report.timing_view import cpu_rows
    from workbook_lib.training.loop import MODES, ArmResult

    def arm(variant, mode, got):
        st = Stat.from_samples([0.01, 0.011, 0.012])
        st.cpu = share(got, 1 - got)
        return ArmResult(f"node_mask_shared/{variant}", "node_mask_shared", variant, mode, 4, 1,
                         st)
    arms = {f"node_mask_shared/{m}": arm(m, m, 0.99) for m in MODES}
    arms[f"node_mask_shared/{PIPELINED}"] = arm(PIPELINED, "full", 0.5)
    rows = cpu_rows(LoopStudy("cpu", "", ["node_mask_shared"], {"node_mask_shared": 4}, True, {},
                              arms))
    modes = [r["mode"] for r in rows]
    assert len(set(modes)) == len(modes) == len(MODES) + 1
    piped = next(r for r in rows if r["mode"].startswith("pipelined"))
    assert piped["contended"] == "CONTENDED"
    assert [r["contended"] for r in rows].count("CONTENDED") == 1
