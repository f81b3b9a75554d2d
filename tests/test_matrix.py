"""A generated matrix of pipeline sets, each through the notebooks at a tiny scale.

The sets are drawn from a family of small pipelines written as a user writes one from the
README (``tests/matrix/family.py``): exact and inexact; one, two and three pipelines; with and
without built-in strategies; the slow one listed first and second; no measurable gap; one that
raises at its 4th forward; a NaN loss; a stalled dataset item; DataLoader workers; a forward
that reaches into a submodule; a LightningModule. Every case runs notebooks 01 to 06 in one
process of its own (``tests/matrix/harness.py``; notebooks 02 and 04, which start processes of
their own, on a few cases), the cases that start processes one at a time, the others in lanes
of one pinned CPU each, and every case must hold the same rules:

* each notebook completes, or refuses in one line (a workbook error, no newline);
* 05 always writes an answer about the pair, or one line saying why not;
* the booked shares of the gap add to 100%;
* every headline is one short sentence (at most 200 characters);
* a contended figure names its cause, and a run of one process with no DataLoader workers is
  never blamed on its own processes (the contention meter's own tests, run alone, check that an
  idle machine is not marked and a busy one is);
* every view renders (no exception), and every ``None`` or empty branch of every view is
  rendered by some case (``test_every_empty_branch_is_rendered``).

The preflight refusals (a submodule-reaching forward) go through the CLI, as a user meets them.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "matrix"))

import harness  # noqa: E402
import lanes  # noqa: E402
from harness import execute  # noqa: E402

from workbook_lib.catalog import NOTEBOOK_NAMES  # noqa: E402
from workbook_lib.configs.validation import check_gap, load_params_file, validate  # noqa: E402
from workbook_lib.exceptions import WorkbookError  # noqa: E402

# every case runs once in the module fixture (about 3 minutes on the 2-core reference machine)
# alone: a case's gap (same_twice: none) is judged from 5 paired steps, which another worker's
# tests beside it moved to a 1.26x 'gap' once; its cases run in lanes of one pinned CPU each
# (two unpinned at a time, a sub-millisecond gap was measured contended by the other case in
# two of three runs)
pytestmark = [pytest.mark.timeout(1800), pytest.mark.alone]

FAMILY = "tests/matrix/family.py"
PLANTED, FAST = "tests/planted/", "tests/planted/fast.py:make_pipeline"
TINY = {"loop_steps": 5, "loop_max_steps": 6, "ddp_steps": 2, "adopt_steps": 4,
        "profile_active": 1, "num_samples": 1000}  # 5 paired steps: the fewest a gap resolves on
QUICK = ("01_graph_inventory", "03_data_vs_model_timing", "05_verdict", "06_adopt_fix")
EVERY = tuple(NOTEBOOK_NAMES)  # 04's normal path with two user pipelines: test_own_pipelines_e2e
NO_04 = tuple(n for n in EVERY if n != "04_ddp_scaling")
WITH_04 = ("01_graph_inventory", "03_data_vs_model_timing", "04_ddp_scaling", "05_verdict")


@dataclass
class Case:
    name: str
    pipelines: list[str]  # family factories, or 'NAME=factory' for a second copy
    strategies: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    notebooks: tuple = QUICK  # 02 and 04 start processes of their own: a few cases only
    expect: dict = field(default_factory=dict)

    def specs(self) -> list[str]:
        out = []
        for p in self.pipelines:
            if p.startswith(("examples/", "tests/")):
                out.append(p)
            elif "=" in p:
                name, fac = p.split("=")
                out.append(f"{name}={FAMILY}:{fac}")
            else:
                out.append(f"{FAMILY}:{p}")
        return out


# the cases whose expectation needs the gap resolved (a named cause, its advice, the order) time
# 9 paired steps, not ci's 6 (lanes.STEADY: in a lane one disturbed pair can veto a gap on 6)
STEADY = lanes.STEADY


def generate() -> list[Case]:
    """The matrix: every dimension the issue lists, each case named by what it holds."""
    cases = [
        # pairs and their order
        Case("slow_fast", ["slow", "fast"], notebooks=NO_04),
        Case("fast_first", ["fast", "slow"], extra=STEADY, expect={"swapped": True}),
        # one pipeline twice: no gap the answer rests on (see _expectations)
        Case("same_twice", ["fast", "again=fast"], expect={"measurable": False}),
        # sizes of the set
        Case("three_with_inexact", ["slow", "fast", "inexact"]),
        Case("two_inexact", ["inexact", "examples/dango_pyg.py:make_pipeline"],
             expect={"recommendation": None}),
        # with the built-in strategies beside
        # (02 with a built-in strategy, 92 s here, runs under papermill in test_notebooks)
        Case("builtins_beside", ["slow", "fast"], strategies=["node_mask_shared"]),
        # faults
        Case("raises_slow", ["raises", "fast"], expect={"no_answer": "raises"}),
        Case("raises_third", ["slow", "fast", "raises"], expect={"failed": "raises"}),
        Case("both_raise", ["first=raises", "second=raises"], expect={"no_answer": "first"}),
        Case("nan_loss", ["slow", "nan"], expect={"nonfinite": "nan"}),
        Case("stalls", ["stalls", "fast"], extra={"stall_timeout_s": 3.0},
             expect={"no_answer": "stalls"}),
        Case("fails_in_04_only", ["unused", "fast"], notebooks=WITH_04,
             expect={"failed": "unused", "missing": "04_ddp_scaling"}),
        # the real client: a TorchCell-style Lazy model against a DANGO-style one
        Case("torchcell", ["tests/rewrites/lazy_dropout_gin.py:make_pipeline",
                           "examples/dango_pyg.py:make_pipeline"], extra=STEADY,
             expect={"first": "forward", "advice": "one shared graph",
                     "site": "MaskedGIN.forward"}),
        # a TorchCell-shaped model that offers its encoder: 05 says what converting it measured
        Case("torchcell_converts", ["examples/torchcell_pyg.py:make_pipeline",
                                    "examples/dango_pyg.py:make_pipeline"],
             extra=STEADY, expect={"lead": "your encoder converts: ",
                                   "site": "TorchCellEncoder.forward"}),
        # the answer names the code: planted causes a user wrote (tests/planted)
        Case("loss_loop", [PLANTED + "slow_loss_loop.py:make_pipeline", FAST], extra=STEADY,
             expect={"first": "loss", "advice": "a Python loop over the samples in the loss",
                     "site": "triplet_rank_loss"}),
        Case("custom_backward", [PLANTED + "slow_custom_backward.py:make_pipeline", FAST],
             extra=STEADY, expect={"first": "backward", "advice": "the custom autograd backward",
                     "site": "GatherRows.backward", "not_advice": "mirrors the forward"}),
        Case("shared_pass_slow", [PLANTED + "slow_shared_pass.py:make_pipeline", FAST],
             extra=STEADY, expect={"site": "DeepModel.forward", "not_advice": "one shared graph"}),
        Case("three_planted", [PLANTED + "slow_loss.py:make_pipeline", FAST,
                               PLANTED + "slow_custom_backward.py:make_pipeline"],
             extra=STEADY, expect={"first": "loss", "advice": "", "site": "soft_rank_loss"}),
        # the loader and the frameworks
        Case("workers", ["slow", "fast"], extra={"num_workers": 1}),
        Case("lightning", ["slow", "lightning"]),
        Case("one_alone", ["fast"], expect={"refused": "there is no gap to explain"}),
        Case("few_steps", ["slow", "fast"], extra={"loop_steps": 3, "loop_max_steps": 3},
             expect={"measurable": False, "lead": "too few paired steps"}),
    ]
    return cases


CASES = generate()


def _params(case: Case) -> dict:
    raw = dict(load_params_file(ROOT / "params" / "ci.yaml"))
    raw.pop("gap_strategies", None)
    return validate({**raw, **TINY, "strategies": case.strategies,
                                "pipelines": case.specs(), **case.extra},
                               source=f"matrix case {case.name}")


def run_case(case: Case, out: Path, traced=None) -> dict:
    """Every notebook of the case in-process, as the CLI would run them (the same checks
    first): name -> Executed, or {"refused": one line} when the run is refused up front.
    ``traced``: what every view call runs in (``harness.views_traced``)."""
    from workbook_lib.pipelines import preflight  # the CLI's checks before any work

    try:
        p = _params(case)
        names = list(case.notebooks)
        check_gap(p, names)
        preflight(p)
    except WorkbookError as exc:
        return {"refused": str(exc)}
    return {nb: execute(nb, p, out, traced) for nb in names}


VIEWS = sorted((ROOT / "workbook_lib" / "report").glob("*.py"))


class Tracer:
    """A re-entrant switch for one coverage tracer: on while any view call runs (the studies'
    measurement runs untraced, 1.5x faster)."""

    def __init__(self, cov):
        self.cov, self.depth = cov, 0

    @contextlib.contextmanager
    def __call__(self):
        self.depth += 1
        if self.depth == 1:
            self.cov.start()
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.cov.stop()


def case_in_child(name: str, out: str) -> tuple:
    """One case in a fresh process (one compute thread: ``lanes.pinned``), its view lines traced
    (coverage, on only while a view renders); returns what it got and the lines."""
    import coverage

    cov = coverage.Coverage(data_file=None, include=[str(p) for p in VIEWS])
    case = next(c for c in CASES if c.name == name)
    got = run_case(case, Path(out), Tracer(cov))
    data = cov.get_data()
    return got, {str(p): set(data.lines(str(p)) or ()) for p in VIEWS}


# the cases that run on every CPU, one at a time, first: those that start processes of their
# own (02's probes, 04's ranks) or a DataLoader worker beside the loop (on one CPU the worker
# would take the loop's turns), and one pipeline listed twice, whose expectation (no gap) a
# case in the other lane can break (CI twice resolved 'fast' over itself in a lane, 1.17x on
# 5 steps that all agreed, where 16 runs here alone gave 0.86x to 1.14x); the rest run in lanes (tests/lanes.py), the longest first
# (seconds measured on the 2-core reference machine; a case not listed counts 10)
WHOLE_MACHINE = ("slow_fast", "fails_in_04_only", "workers", "same_twice")
ROUGH_S = {"torchcell": 21, "torchcell_converts": 20, "builtins_beside": 18,
           "three_with_inexact": 17, "three_planted": 17, "raises_third": 16,
           "custom_backward": 16, "nan_loss": 15, "fast_first": 13, "few_steps": 13,
           "lightning": 13, "shared_pass_slow": 12, "stalls": 11}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every case run once, in a fresh process forked from multiprocessing's fork server, which
    imported PyTorch and the notebooks' modules once, with one compute thread (the tiny cases
    are single-threaded Python): the cases in ``WHOLE_MACHINE`` first, one at a time on every
    CPU, then the others in lanes of one pinned CPU each (``lanes.run``); the suite runs
    nothing else beside (``alone``). Returns what each case got and the report package's lines
    its views executed."""
    order = sorted(CASES, key=lambda c: (c.name not in WHOLE_MACHINE, -ROUGH_S.get(c.name, 10)))
    jobs = {c.name: (c.name, str(tmp_path_factory.mktemp(c.name))) for c in order}
    preload = ["torch", "torch_geometric", "matplotlib.pyplot", "lanes", "test_matrix",
               *[f"workbook_lib.report.{m}" for m in harness.VIEW_MODULES],
               *[f"workbook_lib.studies.{m}"
                 for m in ("inventory", "timing", "verdict", "adoption")]]
    with lanes.fork_server(preload, [str(ROOT / "tests"), str(ROOT / "tests" / "matrix")]) as ctx:
        done = lanes.run(ctx, case_in_child, jobs, whole=WHOLE_MACHINE)
    got = {name: done[name][0] for name in jobs}
    lines = {str(p): set().union(*(done[n][1][str(p)] for n in done)) for p in VIEWS}
    return got, lines


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_case_gets_an_answer_or_one_line_why(case, results):
    from workbook_lib.running.results import load_result, read_meta

    got = results[0][case.name]
    if "refused" in got:
        assert case.expect.get("refused"), got["refused"]
        assert case.expect["refused"] in got["refused"] and "\n" not in got["refused"]
        return
    for name, ex in got.items():
        if ex.status != "ok":  # a refusal in one line, never a crash
            assert ex.error[0] in _WORKBOOK_ERRORS and "\n" not in ex.error[1].strip(), \
                (name, ex.error)
    run = _run_dir(got)
    for name in got:
        meta = read_meta(run, name)
        if meta is not None and meta.complete:
            assert len(meta.headline) <= 200, (name, meta.headline)
    _contention_named(case, load_result(run, "03_data_vs_model_timing"))
    v = load_result(run, "05_verdict")
    assert v is not None, got["05_verdict"].error  # 05 always writes an answer
    assert v.answer.startswith(v.lead) and v.lead and "\n" not in v.lead
    assert all("\n" not in c for c in v.caveats)
    if v.no_answer:
        assert v.lead.startswith("**No answer")
    else:
        booked = [c.share for c in v.causes if c.share is not None]
        if v.gap.measurable and v.gap.steps_agree:
            assert sum(booked) == pytest.approx(1.0)
        else:  # no gap, or full steps that do not show its direction: nothing booked
            assert booked == []
            assert v.gap.measurable or "no gap to explain" in v.lead
    _expectations(case, v)


def _contention_named(case: Case, t) -> None:
    """A contended arm says by whom; 03 runs in this one process, so with no DataLoader workers
    its own processes cannot be what took the CPUs."""
    from workbook_lib.measurement.cpu import OWN_PROCESSES

    if t is None or t.loops is None:
        return
    for key, arm in t.loops.arms.items():
        cpu = arm.step.cpu
        if cpu is None or not arm.step.contended:
            continue
        assert cpu.cause, (key, cpu.describe())
        if not case.extra.get("num_workers"):
            assert cpu.cause != OWN_PROCESSES, (key, cpu.explain())


_WORKBOOK_ERRORS = {"ParamsError", "IncompleteInputsError", "PipelineError", "SnapshotError"}


def _run_dir(got: dict) -> Path:
    return next(iter(got.values())).run_dir


# what only an idle machine's figures can show (a contended gap is never measurable)
IDLE_EXPECTATIONS = {"swapped", "measurable", "first", "site", "lead"}


def _expectations(case: Case, v) -> None:
    e = case.expect
    if v.gap is not None and v.gap.contended and e.keys() & IDLE_EXPECTATIONS:
        # the contended branch, as the answer must give it; the idle expectation cannot be
        # judged on these figures (the cause is named: _contention_named)
        assert not v.gap.measurable and "while other work took the CPUs" in v.headline, v.lead
        pytest.skip(f"{case.name}: its gap was measured contended ({v.headline})")
    if "swapped" in e:
        assert v.gap.swapped == e["swapped"] and v.caveats[0].startswith("Listed the other way")
        assert (v.gap.slow, v.gap.fast) == ("slow", "fast")
    if "measurable" in e and e["measurable"] is False and v.gap.measurable and \
            not v.gap.steps_agree:
        # the gap rule resolves one pipeline over itself now and then by design (its median's
        # interval at about 96%; simulated with the rule: 0.3% to 2% of runs at 10-15% step
        # noise, on 6 steps as on 9; CI met one): where the full steps disagree, the answer
        # ranks no cause and says why (a resolved gap the full steps confirm still fails)
        assert "no cause is ranked" in v.lead, v.lead
    elif "measurable" in e:
        assert v.gap.measurable == e["measurable"]
    if "lead" in e:
        assert e["lead"] in v.lead, v.lead
    if "recommendation" in e:
        assert v.recommendation is None and "No exact pipeline in this run" in v.answer
    if "no_answer" in e:
        assert e["no_answer"] in v.no_answer and e["no_answer"] in v.failures
    if "failed" in e:
        assert e["failed"] in v.failures and not v.no_answer
    if "missing" in e:
        assert e["missing"] in v.missing or v.gap.ddp_factor is None
    first = next((c for c in v.causes if c.effect == "adds"), None)
    if "first" in e:
        assert first.stage == e["first"] and e["advice"] in first.advice, \
            (v.lead, first.finding, first.growth, first.share)
    if "site" in e:  # the function that holds the first cause's extra time
        assert first.sites and first.sites[0].function == e["site"], (first.sites, v.lead)
        assert f"`{e['site']}`" in v.lead, v.lead
    if "not_advice" in e:
        assert all(e["not_advice"] not in c.advice for c in v.causes), v.lead
    if "nonfinite" in e:
        assert e["nonfinite"] in v.nonfinite
        assert v.recommendation is None or v.recommendation.strategy != e["nonfinite"]


def empty_branches(path: Path) -> dict[int, str]:
    """The ``None`` or empty branches of a view module: the first line of the body of every
    ``if`` whose test asks whether something is None or empty (``x is None``, ``not x``, ``not
    x.y``, ``len(x) == 0``) and whose body returns: line -> the function it is in."""
    import ast

    def empty_test(t) -> bool:
        if isinstance(t, ast.BoolOp):
            return any(empty_test(v) for v in t.values)
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            return isinstance(t.operand, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        if isinstance(t, ast.Compare) and len(t.ops) == 1:
            right = t.comparators[0]
            return isinstance(t.ops[0], (ast.Is, ast.Eq)) and (
                (isinstance(right, ast.Constant) and right.value in (None, 0)))
        return False

    out = {}
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.If) and empty_test(node.test) and \
                    any(isinstance(b, ast.Return) for b in node.body):
                out[node.body[0].lineno] = fn.name
    return out


# branches the matrix's tiny CPU cases do not reach: (view, function, words of the branch's
# first line) -> the configuration that reaches it
UNREACHABLE = {
    ("verdict_view.py", "cpu_text", ""): "a GPU run (every claim testable there)",
    ("compare_view.py", "cell", ""): "python -m workbook_lib compare over runs that lack a "
                                     "figure (a tool's page, not a notebook's)",
    ("timing_view.py", "repeats", "no arm measured"): "none: its callers return first when no "
                                                      "arm was measured (both_raise)",
    ("tables.py", "fmt_seconds", "n/a"): "a figure a result lacks where a table quotes it: no "
                                         "tiny case leaves one None there",
    ("tables.py", "fmt_num", "n/a"): "the same",
    ("tables.py", "fmt_stat", "n/a"): "the same",
    ("tables.py", "fmt_time_stat", "n/a"): "the same",
    ("verdict_view.py", "lead", "if not first"): "a measured gap no stage holds 5% of",
    ("inventory_view.py", "footprint_text", "No footprint"): "a result from before 01 computed "
                                                             "the footprint",
    ("inventory_view.py", "real_size_table", "A user's graph"): "a snapshot of a user's own "
                                                                "graph (no spec)",
    ("mask_cost_view.py", "memory_plot", "No plot"): "a run whose every memory point failed or "
                                                     "is below resolution (a user pipeline pair "
                                                     "at ci params; test_report_headlines draws "
                                                     "it directly)",
    ("mask_cost_view.py", "layer_plot", "NO_BUILTIN"): "built-in strategies none of which has a "
                                                       "layer of its own",
    ("bench_view.py", "versus", "n/a against"): "a benchmark whose replicated forms did "
                                                "not run (out of memory at B = 1)",
    ("mask_cost_view.py", "headline_bench_part", 'return ""'): "the same",
    ("bench_text.py", "floor_drift", "same is None or first is None"): "a bench result from "
                                                                        "before the same-rounds "
                                                                        "line, or without rates "
                                                                        "(test_bench_convert "
                                                                        "draws it directly)",
    ("bench_view.py", "bar_label", "return text"): "a benchmark's bars: notebook 02 with a "
                                                   "built-in strategy, rendered under "
                                                   "papermill in test_notebooks (92 s "
                                                   "in-process, so not a matrix case)",
    ("bench_view.py", "floor_table", "No floor"): "the shared form at one layer (no delta "
                                                  "path)",
    ("bench_text.py", "replicated_ratio_text", 'return ""'): "a benchmark (02 with a built-in "
                                                            "strategy: test_notebooks) whose "
                                                            "replicated forms did not run",
    ("bench_text.py", "replicated_ratio_text", "fit is None"): "the same",
    ("bench_text.py", "convert_rows", "c is None"): "a benchmark from before its convert "
                                                    "section (an older results file)",
    ("bench_text.py", "convert_lines", "c is None"): "the same",
    ("bench_view.py", "convert_table", "No convert section"): "the same",
    ("bench_text.py", "part_rows", "c.parts is None"): "a benchmark from before its per-part "
                                                       "table, or without floor rates (an older "
                                                       "results file; test_bench_convert draws "
                                                       "it)",
    ("bench_view.py", "convert_parts_table", "No per-part times"): "the same",
    ("cpu_view.py", "kernel_cell", "not read"): "CPU figures from before the kernel's share was "
                                                "read (an older results file)",
    ("verdict_view.py", "causes_plot", "not g.steps_agree"): "full steps that came out the "
                                                            "other way from the plain-loop gap "
                                                            "(a disturbed machine; "
                                                            "test_verdict_compare draws it)",
    ("verdict_view.py", "code_table", "if not rows"): "first causes none of which the profile "
                                                      "attributes to a function (which stage "
                                                      "comes first varies with the machine's "
                                                      "load)",
}


def _unreachable(path: Path, fn: str, line: int) -> bool:
    text = path.read_text().splitlines()[line - 1] + path.read_text().splitlines()[line - 2]
    return any(f == path.name and g == fn and words in text
               for f, g, words in UNREACHABLE)


@pytest.mark.slow
def test_every_empty_branch_is_rendered(results):
    """Every None or empty branch of every view was rendered by some case of the matrix."""
    _got, lines = results
    missing = []
    for p in VIEWS:
        for line, fn in empty_branches(p).items():
            if _unreachable(p, fn, line):
                continue
            if line not in lines[str(p)]:
                missing.append(f"{p.name}:{line} ({fn})")
    assert not missing, "\n".join(["not rendered by any case:"] + missing)
