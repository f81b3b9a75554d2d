"""Every notebook under papermill with the ci params (one run shared by the tests), the HTML a
reader gets, and the habits of papermill and JupyterLab users."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbook_lib.studies.adoption import loss_fall
from workbook_lib.catalog import NOTEBOOK_NAMES
from workbook_lib.measurement.timing import Stat
from workbook_lib.running import notebooks as nbsrc
from workbook_lib.exceptions import ParamsError
from workbook_lib.configs.validation import check_gap, load_params_file, validate
from workbook_lib.report.html import write_index
from workbook_lib.running.run_folder import run_notebooks
from workbook_lib.running.results import load_result, read_meta

ROOT = Path(__file__).resolve().parent.parent
PAPERMILL = [sys.executable, "-m", "papermill"]


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ci_run")
    p = load_params_file(ROOT / "params" / "ci.yaml")
    outcomes = run_notebooks(p, out, progress=False, log_output=False, write_index=write_index)
    return out, {o.name: o for o in outcomes}


def test_sources_are_thin_and_their_parameters_cells_current():
    assert nbsrc.sync(check=True) == []
    for name in NOTEBOOK_NAMES:
        text = (ROOT / "notebooks" / f"{name}.py").read_text()
        code = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert not [ln for ln in code if re.match(r"\s*(def|class|for|while) ", ln)], name
        assert text.count('# %% tags=["parameters"]') == 1, name


def test_built_notebooks_are_not_tracked():
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    assert not [f for f in tracked if f.endswith(".ipynb")]
    ignored = subprocess.run(["git", "check-ignore", "-q", "notebooks/01_graph_inventory.ipynb"],
                             cwd=ROOT)
    assert ignored.returncode == 0  # running one in JupyterLab never dirties the repository


def test_every_notebook_ran(ci_run):
    out, outcomes = ci_run
    assert set(outcomes) == set(NOTEBOOK_NAMES)
    for name, o in outcomes.items():
        assert o.status == "ok", (name, o.error)
        for ext in ("ipynb", "html", "json"):
            assert (out / f"{name}.{ext}").is_file()
        assert load_result(out, name) is not None, name  # typed results read back
    env = json.loads((out / "environment.json").read_text())
    assert env["params"]["scale"] == 0.005 and "torch" in env["versions"]


def test_results_of_each_notebook(ci_run):
    out, _ = ci_run
    inv = load_result(out, "01_graph_inventory")
    assert inv.num_genes == 6607 and inv.total_edges == sum(t.edges for t in inv.edge_types)
    mc = load_result(out, "02_mask_cost_model")
    assert max(mc.exact.values()) < 1e-4 and len(mc.exact) == 7
    assert all(p.status == "ok" and p.step_bytes > 0 for p in mc.memory.points)
    for fit in mc.memory.fits.values():
        assert fit.per_sample_bytes > 0 and len(fit.residuals) == len(fit.points) >= 3
    assert mc.bench.per_sample_s["shared"].n >= 3 and mc.bench.rates
    # the delta form measured though the ci model has 2 layers; ci caps the replicated batch
    assert mc.bench.sizes["layers"] == 3 and mc.bench.shared_form.startswith("delta, push ")
    assert not mc.bench.replicated["replicated_gather_scatter"].measured
    assert mc.bench.per_sample_s["replicated_sparse"].batch_reason.startswith(
        "measured at B = 2, the largest batch that ran")  # quoted as measured, not projected
    f = mc.bench.floor  # the exact sample's floor beside the step's measured counts
    assert f is not None and f.ratio("dense") >= 1.0 and f.measured_sparse_macs > 0
    assert mc.dual_masks.single_bytes > 0 and mc.dual_masks.dual_bytes == \
        mc.dual_masks.single_bytes  # the wildtype pass reads no mask
    t = load_result(out, "03_data_vs_model_timing")
    for a in t.loops.arms.values():
        assert a.timed_steps == a.step.n >= 3 and a.warmup_steps == 1
        assert a.step.q1 <= a.step.median <= a.step.q3  # quartiles of the steps, in order
        # each stage inside its step: no stage sample longer than the step it belongs to
        assert all(x <= w for s_ in a.stages.values() for x, w in zip(s_.samples,
                                                                     a.step.samples))
    kinds = t.syncs.kinds  # besides the batch's pageable copies (3 tensors for both)
    assert kinds["device_mask_loop"].get("item/bool/int/float", 0) > 0
    assert set(kinds["device_mask_vectorized"]) <= {"host-to-device copy (pageable memory)"}
    assert t.stored_reads is not None and t.stored_reads.cold_ms.n >= 1
    for p in t.profiles.values():
        assert p.schedule["wait"] >= 1 and p.schedule["warmup"] >= 1
        assert (out / p.trace).is_file()  # relative to the run folder
    d = load_result(out, "04_ddp_scaling")
    assert set(d.worlds) == {1, 2} and d.plan.backend == "gloo"
    assert d.worlds[2].comm_total is not None and d.ratio_03 is not None
    # equal threads per rank at both world sizes, launches alternated 1, 2, 1, 2
    assert set(d.worlds[1].threads_per_rank) == set(d.worlds[2].threads_per_rank)
    assert d.worlds[1].launches == d.worlds[2].launches == 2 and len(d.gap.factor_by_pair) == 2
    g = d.gap  # the DDP factor always applied
    assert g.total.median == pytest.approx(g.steps_ratio * g.per_step_ratio.median *
                                           g.ddp_factor.median)
    assert set(g.step_factors) == {d.scaling_strategy, *d.gap_strategies}
    assert set(d.worlds[2].comm_per_rank) == {0, 1}
    assert t.loops.pipelined("node_mask_shared") is not None
    v = load_result(out, "05_verdict")
    assert v.recommendation.strategy and v.claims
    # the answer opens with its one sentence about the pair, caveats one line each after it
    assert v.answer.startswith(v.lead) and v.lead.startswith("**Replicated masks")
    if v.gap.contended:  # beside the other test workers: no gap, said so (never booked)
        assert not v.gap.measurable and "no gap is resolved" in v.lead and "quiet" in v.lead
    elif not v.gap.measurable:  # a step disturbed by the other worker's tests vetoed it: said so
        assert ("gap is not resolved" in v.lead or "no gap is resolved" in v.lead) and \
            "no gap to explain on" in v.lead, v.lead
    else:
        assert "slower per epoch than" in v.lead and ("first cause:" in v.lead or
                                                      "first causes, not told apart" in v.lead)
    assert all("\n" not in c for c in v.caveats)
    assert set(v.inputs) == {"01_graph_inventory", "02_mask_cost_model",
                             "03_data_vs_model_timing", "04_ddp_scaling"}
    if v.gap.measurable:
        assert sum(c.share for c in v.causes if c.share is not None) == pytest.approx(1.0)
    assert "The investigation observed about 40x" in v.answer  # built-in strategies ran
    for name in NOTEBOOK_NAMES:  # one short sentence each on the index
        assert len(read_meta(out, name).headline) <= 200, name
    a = load_result(out, "06_adopt_fix")
    assert a.max_rel_diff <= 1e-5
    assert a.speedup.median == pytest.approx(Stat.from_samples(
        [r / f for r, f in zip(a.step["replicated"].samples, a.step["fix"].samples)]).median)
    first, last = loss_fall(a.losses["replicated"])
    assert last < first / 10  # a learnable target: the loss falls
    # the fix's label names the path its step took at the run's depth
    layers = read_meta(out, "06_adopt_fix").params["layers"]
    assert ("(plain 2-layer (no middle layer))" if layers == 2 else "(delta, push") \
        in a.labels["fix"]


def _text(html):
    html = re.sub(r"<style.*?</style>|<script.*?</script>", "", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def test_the_html_a_reader_gets(ci_run):
    out, _ = ci_run
    for name in NOTEBOOK_NAMES:
        html = (out / f"{name}.html").read_text()
        body = re.sub(r"<style.*?</style>", "", html, flags=re.S)
        text = _text(html)
        assert "jp-InputArea-editor" not in body and "highlight hl-" not in body, name
        prose = _text(re.sub(r"<pre.*?</pre>", "", body, flags=re.S))  # code shown on purpose
        assert "import " not in prose and "setup(globals())" not in prose, name  # no code
        for bad in ("it/s]", "%|", "USDT", "Warning", "warn(", "Traceback", "<stderr>"):
            assert bad not in text, (name, bad)
        # the glossary: linked from the top, every term the reports use defined at the end
        assert 'href="#glossary"' in html and 'id="glossary"' in html, name
        assert "<strong>Dual forward</strong>" in html and "<strong>Floor</strong>" in html
        imgs = re.findall(r"<img[^>]*>", html)
        assert imgs, name  # every report has figures
        for tag in imgs:
            alt = re.search(r'alt="([^"]*)"', tag)
            assert alt and len(alt.group(1)) > 20 and "No description" not in alt.group(1), name
        assert re.search(r"<th[^>]*>\s*</th>", html) is None or name == "05_verdict"
    index = (out / "index.html").read_text()
    v = json.loads((out / "05_verdict.json").read_text())
    first_words = re.sub(r"[*_`]", "", v["answer"]).split("\n")[0][:40]
    flat = re.sub(r"\s+", " ", _text(index))
    assert ("slower per epoch" in flat or "no gap is resolved" in flat) and first_words[:25] in flat
    verdict_html = _text((out / "05_verdict.html").read_text())
    assert verdict_html.index("The answer") < verdict_html.index("The gap, stage by stage")
    assert "traces_03/" in index and "ddp_04/world2/" in index  # relative links
    assert str(out) not in index


def test_papermill_parameters_and_help(tmp_path):
    nb = ROOT / "notebooks" / "01_graph_inventory.ipynb"
    r = subprocess.run([*PAPERMILL, "--help-notebook", str(nb)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0
    for line in ("scale: float (default 0.1)", "hidden: int (default 32)",
                 "pipelines: List[str] (default [])", "run_dir: str"):
        assert line in r.stdout, (line, r.stdout[:2000])
    # the keys notebook 01 reads, not those of the notebooks after it (papermill still takes any)
    assert "memory_budget_gb" not in r.stdout and "ddp_batch_size" not in r.stdout
    # from another directory: -p values are used, a relative run_dir lands in the repository
    r = subprocess.run([*PAPERMILL, str(nb), str(tmp_path / "o.ipynb"), "-p", "scale", "0.002",
                        "-p", "hidden", "8", "-p", "run_dir", str(tmp_path), "-k", "python3"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((tmp_path / "01_graph_inventory.json").read_text())["_meta"]
    assert meta["params"]["scale"] == 0.002 and meta["params"]["hidden"] == 8
    r = subprocess.run([*PAPERMILL, str(nb), str(tmp_path / "p.ipynb"), "-f",
                        str(ROOT / "params" / "ci.yaml"), "-p", "run_dir", str(tmp_path / "f"),
                        "-k", "python3"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((tmp_path / "f" / "01_graph_inventory.json").read_text())["_meta"]
    assert meta["params"]["scale"] == 0.005  # params/ci.yaml through -f


def test_papermill_bad_values_fail_clearly_before_work(tmp_path):
    nb = ROOT / "notebooks" / "01_graph_inventory.ipynb"
    for extra, words in ((["-p", "params", '{"scale": 0.1}'], "-p KEY VALUE"),
                         (["-p", "hiden", "8"], "did you mean 'hidden'"),
                         (["-p", "scale", "-1"], "'scale' must be positive")):
        r = subprocess.run([*PAPERMILL, str(nb), str(tmp_path / "o.ipynb"), *extra, "-p",
                            "run_dir", str(tmp_path), "-k", "python3"], capture_output=True,
                           text=True, cwd=tmp_path)
        assert r.returncode != 0 and "ParamsError" in r.stderr and words in r.stderr, \
            r.stderr[-1500:]
        assert not (tmp_path / "01_graph_inventory.json").exists()


def test_verdict_refuses_without_notebook_03(tmp_path):
    """03's timings of the pair are the verdict's one required input: without them it refuses
    in one line, and writes no results."""
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(ROOT / "notebooks" / "05_verdict.ipynb"),
                            str(tmp_path / "05.ipynb"), parameters={"run_dir": str(tmp_path)},
                            kernel_name="python3", progress_bar=False)
    assert e.value.ename == "IncompleteInputsError"
    assert "03_data_vs_model_timing: not run" in e.value.evalue
    assert "\n" not in e.value.evalue.strip()
    assert not (tmp_path / "05_verdict.json").exists()


def _without_cpu_shares(run_dir):
    """Drop every figure's CPU share from a run folder's results."""
    def strip(x):
        if isinstance(x, dict):
            return {k: (None if k == "cpu" else strip(v)) for k, v in x.items()}
        return [strip(v) for v in x] if isinstance(x, list) else x
    for f in run_dir.glob("[0-9][0-9]_*.json"):
        f.write_text(json.dumps(strip(json.loads(f.read_text()))))


def test_stability_compares_figures_and_claim_statuses(ci_run, tmp_path):
    """Two copies of one run agree everywhere; a copy with one claim flipped and the machine
    twice as slow is called out: the claim row names both statuses, the absolute time says why."""
    import shutil
    from workbook_lib.tools.stability import compare_figures

    out, _ = ci_run
    a, b = tmp_path / "run1", tmp_path / "run2"
    shutil.copytree(out, a)
    shutil.copytree(out, b)
    for d in (a, b):  # as if measured alone: on a busy machine the figures are contended and
        _without_cpu_shares(d)  # not judged (tests/test_cpu_contention.py covers that)
    same = compare_figures([a, b])
    assert same.disagreeing == [] and any(r.key == "claim_statuses" for r in same.rows)

    verdict = json.loads((b / "05_verdict.json").read_text())
    held = next(c for c in verdict["claims"] if c["status"] == "held")
    failed = next(c for c in verdict["claims"] if c["status"] == "failed")
    held["status"], failed["status"] = "failed", "held"  # the count of held claims stays
    (b / "05_verdict.json").write_text(json.dumps(verdict))
    mc = json.loads((b / "02_mask_cost_model.json").read_text())
    mc["bench"]["steps"]["shared"]["median"] *= 2
    (b / "02_mask_cost_model.json").write_text(json.dumps(mc))
    ddp = json.loads((b / "04_ddp_scaling.json").read_text())
    f = ddp["gap"]["ddp_factor"]  # a factor twice as large, IQR clear of the first run's
    f["median"], f["q1"], f["q3"] = f["median"] * 2 + 1, f["q3"] * 2 + 1, f["q3"] * 2 + 1.1
    ddp["gap"]["total"]["median"] *= 2
    (b / "04_ddp_scaling.json").write_text(json.dumps(ddp))

    diff = {r.key: r for r in compare_figures([a, b]).disagreeing}
    assert set(diff) == {"claim_statuses", f"claim:{held['key']}", f"claim:{failed['key']}",
                         "shared_step", "gap_total", "ddp_factor"}
    assert "factors differ beyond their IQRs" in diff["gap_total"].note  # the DDP factor
    assert [v.split(":")[0] for v in diff[f"claim:{held['key']}"].values] == ["held", "failed"]
    assert [v.split(":")[0] for v in diff[f"claim:{failed['key']}"].values] == ["failed", "held"]
    assert "machine's speed" in diff["shared_step"].note


PLANTED = ["tests/planted/slow_item.py:make_pipeline", "tests/planted/fast.py:make_pipeline"]


def test_one_pipeline_alone_runs_01_to_03_and_refuses_the_gap_notebooks(tmp_path):
    """One pipeline, no built-in strategy: valid params (01-03 profile it), and the notebooks
    that compare two pipelines are refused in one line before any work (exit 2, no folder)."""
    raw = dict(load_params_file(ROOT / "params" / "ci.yaml"))
    raw.pop("gap_strategies")
    p = validate({**raw, "strategies": [], "pipelines": PLANTED[1:]})
    assert p["gap_strategies"] == []
    check_gap(p, ["01_graph_inventory", "03_data_vs_model_timing"])  # no error
    with pytest.raises(ParamsError, match="there is no gap to explain"):
        check_gap(p, ["05_verdict"])
    with pytest.raises(ParamsError, match="names one or more"):
        validate({**raw, "strategies": [], "pipelines": []})
    r = subprocess.run([sys.executable, "-m", "workbook_lib", "run", "--params", "ci", "--out",
                        str(tmp_path / "o"), "--set", "strategies=[]", "--set",
                        f"pipelines={json.dumps(PLANTED[1:])}"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and not (tmp_path / "o").exists()
    line = r.stderr.strip().splitlines()[-1]
    assert "04_ddp_scaling, 05_verdict, 06_adopt_fix compare two pipelines" in line
    assert "pipelines checked" not in r.stderr  # refused before the pipelines were built
