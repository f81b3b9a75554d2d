"""Every notebook, executed under papermill with the ci params (one run shared by the tests)."""
import json
from pathlib import Path

import nbformat
import pytest

from workbook_lib.running import params as params_mod
from workbook_lib.running import runner

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ci_run")
    p = params_mod.load_params_file(ROOT / "params" / "ci.yaml")
    outcomes = runner.run_notebooks(p, out, progress=False, log_output=False)
    return out, {o.name: o for o in outcomes}


def _results(out, name):
    return json.loads((out / f"{name}.json").read_text())


def test_source_notebooks_clean_and_in_sync():
    import sys
    sys.path.insert(0, str(ROOT / "tools"))
    import build_notebooks
    assert build_notebooks.build(check=True) == []
    for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        nb = nbformat.read(str(path), as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, path.name
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.outputs and c.execution_count is None, path.name


def test_every_notebook_ran(ci_run):
    out, outcomes = ci_run
    assert set(outcomes) == set(runner.available_notebooks())
    for name, o in outcomes.items():
        assert o.status == "ok", (name, o.error)
        for ext in ("ipynb", "html", "json"):
            assert (out / f"{name}.{ext}").is_file()
    assert (out / "index.html").is_file() and (out / "environment.json").is_file()
    env = json.loads((out / "environment.json").read_text())
    assert env["params"]["scale"] == 0.005 and "torch" in env["versions"]


def test_01_inventory_results(ci_run):
    out, _ = ci_run
    r = _results(out, "01_graph_inventory")
    for key in ("num_genes", "total_edges", "edge_types", "mask_bytes_per_sample",
                "mask_bytes_per_batch", "replicated_edge_index_bytes_per_batch",
                "incidence_cache_bytes", "dataset_mask_storage_bytes",
                "removed_edge_fraction", "hop_coverage"):
        assert key in r, key
    assert r["num_genes"] == 6607
    assert r["total_edges"] == sum(t["edges"] for t in r["edge_types"])
    assert r["mask_bytes_per_sample"] == r["total_edges"]
    assert r["mask_bytes_per_batch"]["28"] == 28 * r["total_edges"]
    assert r["replicated_edge_index_bytes_per_batch"]["4"] == 4 * 2 * 8 * r["total_edges"]
    assert set(r["hop_coverage"]) == {"1", "2", "3"}
    assert r["_meta"]["complete"] and r["_meta"]["environment"]["versions"]["torch"]
    html = (out / "01_graph_inventory.html").read_text()
    assert "data:image/png;base64" in html


def test_02_cost_model_results(ci_run):
    out, _ = ci_run
    r = _results(out, "02_mask_cost_model")
    assert set(r["coefficients"]) == {"alpha", "beta", "gamma", "delta"}
    assert all({"value", "unit"} <= set(v) for v in r["coefficients"].values())
    assert "crossover_p" in r
    assert {"median_abs_rel", "max_abs_rel"} <= set(r["prediction_error"])
    assert "E" in r["layer_time_s"] and "H" in r["layer_time_s"]
    assert "node_mask_shared" in r["layer_time_s"]
    assert max(r["exact"].values()) < 1e-4 and len(r["exact"]) == 7
    full = r["full_size_ratio_shared_vs_replicated"]
    assert {"value", "replicated_form", "batch_sizes", "ratio_vs_sparse_form"} <= set(full)
    assert r["memory"]["points"]


def test_03_timing_results(ci_run):
    out, _ = ci_run
    r = _results(out, "03_data_vs_model_timing")
    for key in ("it_per_s", "ms_per_sample", "stage_seconds", "syncs_per_step",
                "epochs_per_day", "profile_categories", "profile_coverage", "brief_comparison"):
        assert key in r, key
    assert set(r["it_per_s"]["node_mask_shared"]) == {"data", "forward", "forward_backward", "full"}
    assert r["syncs_per_step"]["device_mask_loop"] > 0
    assert r["syncs_per_step"]["device_mask_vectorized"] == 0
    for name, cov in r["profile_coverage"].items():
        assert 0.95 <= cov <= 1.05, (name, cov)
    assert set(r["epochs_per_day"]["dango_wildtype"]) == {"1", "4"}
    for trace in r["traces"].values():
        assert Path(trace).is_file()


def test_04_ddp_results(ci_run):
    out, _ = ci_run
    r = _results(out, "04_ddp_scaling")
    assert set(r["step_time_s"]) == {"1", "2"}
    for key in ("scaling_efficiency", "comm_fraction", "grad_accum_vs_ddp",
                "predicted_step_time_s"):
        assert key in r
    assert {"steps_ratio", "per_step_ratio", "ddp_factor", "total"} <= set(r["gap_decomposition"])
    assert r["backend"] == "gloo"


def test_05_verdict_results(ci_run):
    out, _ = ci_run
    r = _results(out, "05_verdict")
    assert r["missing"] == []
    assert r["recommendation"]["strategy"]
    assert any(c["status"] == "held" for c in r["claims"])
    assert r["gap_causes"]
    assert "use " in r["_meta"]["headline"]


@pytest.mark.parametrize("name", ["01_graph_inventory", "05_verdict"])
def test_notebook_runs_with_its_own_defaults(name, tmp_path):
    """As in JupyterLab: nothing injected but where results go (so the repo stays clean)."""
    import papermill as pm

    out = tmp_path / f"{name}.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / f"{name}.ipynb"), str(out),
                        parameters={"run_dir": str(tmp_path)}, cwd=str(ROOT / "notebooks"),
                        kernel_name="python3", progress_bar=False)
    res = json.loads((tmp_path / f"{name}.json").read_text())
    assert res["_meta"]["params"]["scale"] == 0.1  # params/default.yaml
    if name == "05_verdict":
        assert len(res["missing"]) == 4  # nothing else ran in this folder: named, not fatal
