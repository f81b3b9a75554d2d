"""A figure is disturbed when its median is not known to the precision target, whatever the
spread of its steps; a gap measured while contended is never one (issue 44, both ways).

* A varied workload (``tests/planted/varied_item.py``: items that search 1 to 4 hops deep, so
  steps spread widely), timed long enough on an idle machine: its gap is measured and not
  disturbed, although its steps' IQR/median is beyond the target.
* The same pair timed for the fewest steps (5): not known to a 3% target, disturbed. With
  five rounds the median's interval is their range, min to max: this checks that five rounds of
  a varied workload spread beyond +-3% and that the rule then marks the gap disturbed. (Six
  runs of five rounds of this pair put it 16% to 37% either side of the median; at the 10%
  default a lucky five came inside it once in CI.)
* The fast pipeline listed twice beside busy processes, two per CPU: contended, no gap. (One
  per CPU leaves its thread n/(n+1) of a CPU on n CPUs, 2/3 on two at best, and the scheduler
  need not share evenly: once in CI it got 81%, above the 80% rule; two per CPU leave it at most
  n/(2n+1), under half.)
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import skip_when_other_jobs
from workbook_lib.configs.validation import load_params_file, validate
from workbook_lib.running.notebook import load_checked_snapshot
from workbook_lib.studies import timing as study
from workbook_lib.studies import verdict as V

pytestmark = pytest.mark.alone  # idle timings: nothing else may run beside them

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ROOT / "tests" / "planted"


def _params(pipelines: list[str], **extra):
    raw = dict(load_params_file(ROOT / "params" / "ci.yaml"))
    raw.pop("gap_strategies", None)
    raw.update(strategies=[], pipelines=pipelines, **extra)
    return validate(raw)


@pytest.fixture(scope="module")
def graph():
    return load_checked_snapshot(load_params_file(ROOT / "params" / "ci.yaml"))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


VARIED = [f"{PLANTED / 'varied_item'}.py:make_pipeline", f"{PLANTED / 'fast'}.py:make_pipeline"]


def _gap(p, graph):
    loops = study.run_loops(p, graph, torch.device("cpu"))
    return loops, V.measure_gap(loops, *p["gap_strategies"], p["num_samples"])


def test_a_varied_workload_timed_long_enough_is_not_disturbed(graph):
    p = _params(VARIED, loop_steps=10, loop_max_steps=120, loop_budget_s=90)
    loops, g = _gap(p, graph)
    skip_when_other_jobs(loops)
    steps = loops.arm("varied_item").step
    assert steps.rel_iqr > p["precision_target"], steps  # its steps do spread widely
    assert g.measurable and not g.contended, g.ratio.cpu
    assert g.ratio.known_to(p["precision_target"]), (g.ratio.ci_half_width(), g.ratio.n)
    assert "gap" not in V.disturbed_figures(g, None, p["precision_target"])


def test_the_same_workload_timed_too_briefly_is_disturbed(graph):
    p = _params(VARIED, loop_steps=5, loop_max_steps=5, precision_target=0.03)
    _loops, g = _gap(p, graph)
    assert g.ratio.n == 5, g.ratio
    assert not g.ratio.known_to(p["precision_target"]), g.ratio
    assert "gap" in V.disturbed_figures(g, None, p["precision_target"])


def _hogs(n: int, out: list[subprocess.Popen]) -> None:
    """Start ``n`` busy processes, each added to ``out`` before it is waited for (the caller
    kills them all, however this ends)."""
    for _ in range(n):
        out.append(subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\n"
                                     "while True: pass"], stdout=subprocess.PIPE, text=True))
        assert out[-1].stdout.readline().strip() == "ready"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 4, reason="it starts two busy "
                    "processes per CPU: kept to machines of at most 4 CPUs")
def test_one_pipeline_listed_twice_beside_busy_processes_shows_no_gap(graph):
    fast = f"{PLANTED / 'fast'}.py:make_pipeline"
    p = _params([fast, f"again={fast}"], loop_steps=5, loop_max_steps=8)
    hogs: list[subprocess.Popen] = []
    try:
        _hogs(2 * len(os.sched_getaffinity(0)), hogs)
        time.sleep(0.2)
        _loops, g = _gap(p, graph)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert g.contended and not g.measurable and not g.swapped, (
        g.ratio, g.ratio.cpu and g.ratio.cpu.describe(), g.ratio.cpu and g.ratio.cpu.explain())
