"""Every notebook, executed under papermill with the ci params (one run shared by the tests)."""
import json
from pathlib import Path

import nbformat
import pytest

from workbook_lib import params as params_mod
from workbook_lib import runner

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
