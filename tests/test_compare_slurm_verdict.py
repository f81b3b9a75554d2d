import json
import subprocess
from pathlib import Path

import pytest

from workbook_lib.measurement import memory
from workbook_lib.running import slurm
from workbook_lib.analysis import verdict
from workbook_lib.analysis.compare import compare_runs, headline_numbers
from workbook_lib.exceptions import RunComparisonError

ROOT = Path(__file__).resolve().parent.parent


def _run(d: Path, checksum: str, step: float):
    d.mkdir()
    meta = {"snapshot_checksum": checksum, "complete": True, "params": {}, "headline": "h"}
    (d / "01_graph_inventory.json").write_text(json.dumps({
        "total_edges": 100, "mask_bytes_per_sample": 100, "incidence_cache_bytes": 5000,
        "removed_edge_fraction": {"mean": 0.01}, "hop_coverage": {"1": 0.1, "2": 0.5},
        "_meta": meta}))
    (d / "04_ddp_scaling.json").write_text(json.dumps({
        "step_time_s": {"1": step, "2": step * 1.2}, "scaling_efficiency": {"1": 1.0},
        "gap_decomposition": {"total": 7.0, "steps_ratio": 2.0, "per_step_ratio": 3.0,
                              "ddp_factor": 1.1}, "_meta": meta}))
    (d / "environment.json").write_text(json.dumps({"device_label": "cpu: test",
                                                    "params": {"scale": 0.1},
                                                    "git": {"revision": "abc"}}))


def test_compare_side_by_side(tmp_path):
    _run(tmp_path / "a", "s1", 2.0)
    _run(tmp_path / "b", "s1", 1.0)
    nums = headline_numbers(tmp_path / "a")
    assert nums["04_ddp_scaling"]["step_time_s.1"] == 2.0
    out = compare_runs(tmp_path / "a", tmp_path / "b")
    html = out.read_text()
    assert "step_time_s.1" in html and "0.5" in html and "hop_coverage.2" in html


def test_compare_refuses_different_snapshots(tmp_path):
    _run(tmp_path / "a", "s1", 2.0)
    _run(tmp_path / "b", "s2", 1.0)
    with pytest.raises(RunComparisonError, match="different snapshots"):
        compare_runs(tmp_path / "a", tmp_path / "b")
    assert "different snapshots" in compare_runs(tmp_path / "a", tmp_path / "b",
                                                 force=True).read_text()
    with pytest.raises(RunComparisonError, match="does not exist"):
        compare_runs(tmp_path / "a", tmp_path / "zzz")


def test_compare_cli(tmp_path):
    _run(tmp_path / "a", "s1", 2.0)
    _run(tmp_path / "b", "s2", 1.0)
    r = subprocess.run([str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists()
                        else "python", "-m", "workbook_lib", "compare", str(tmp_path / "a"),
                        str(tmp_path / "b")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "--force" in r.stderr


@pytest.mark.parametrize("array", [True, False])
def test_slurm_scripts_are_valid_bash(tmp_path, array):
    paths = slurm.write_scripts(ROOT / "params" / "full.yaml", tmp_path, partition="gpu",
                                gpus_per_node=4, nodes=2, time="12:00:00", array=array)
    for p in paths.values():
        r = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    text = paths["sbatch"].read_text()
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --time=12:00:00" in text
    assert "-m workbook_lib run --params" in text and "--resume" in text
    assert 'nnodes=$SLURM_NNODES' in text and "rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT" in text
    if array:
        assert "#SBATCH --array=0-3" in text and "04_ddp_scaling" in text
        assert "05_verdict" not in text
        assert "--dependency=afterany" in paths["submit"].read_text()
        assert "--only 05_verdict" in paths["verdict"].read_text()
    else:
        assert "--array" not in text and "05_verdict" in text


def test_slurm_rejects_bad_params(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scale: 0\n")
    with pytest.raises(Exception, match="'scale'"):
        slurm.sbatch_script(bad)


def test_memory_fit_largest_batch():
    pts = [{"batch_size": 1, "bytes": 4e9}, {"batch_size": 2, "bytes": 6e9},
           {"batch_size": 4, "bytes": None, "reason": "out of memory"}]
    fit = memory.fit_largest_batch(pts, 80e9)
    assert fit["per_sample_bytes"] == pytest.approx(2e9)
    assert fit["fixed_bytes"] == pytest.approx(2e9)
    assert fit["largest_batch"] == 39
    assert memory.fit_largest_batch(pts[:1], 80e9)["largest_batch"] is None


def test_memory_probe_runs_in_a_fresh_process():
    from workbook_lib.running.params import validate
    p = validate({"scale": 0.002, "device": "cpu"})
    r = memory.measure_point(p, strategy="node_mask_shared", form="spmm", batch_size=2,
                             scale=0.002, hidden=4, layers=1)
    assert r["reason"] is None and r["bytes"] is not None and r["bytes"] >= 0


def _synthetic_found():
    stages = {"replicated_mask_cpu": {"loader_wait": 0.5, "h2d": 0.0, "device_prep": 0.0,
                                      "forward": 1.0, "backward": 1.5, "optimizer": 0.01},
              "dango_wildtype": {"loader_wait": 0.001, "h2d": 0.0, "device_prep": 0.0,
                                 "forward": 0.05, "backward": 0.1, "optimizer": 0.01},
              "node_mask_shared": {"forward": 0.2, "backward": 0.3}}
    return {
        "01_graph_inventory": {"total_edges": 2_423_370, "incidence_cache_bytes": 38_880_000,
                               "removed_edge_fraction": {"mean": 0.002}},
        "02_mask_cost_model": {"crossover_p": 0.09, "exact": {"node_mask_shared": 1e-7},
                               "full_size_ratio_shared_vs_replicated": {
                                   "value": 20.0, "ratio_vs_sparse_form": 3.0}},
        "03_data_vs_model_timing": {
            "batch_sizes": {"replicated_mask_cpu": 28, "dango_wildtype": 64,
                            "node_mask_shared": 28},
            "stage_seconds": stages,
            "ms_per_sample": {"replicated_mask_cpu": {"full": 100.0},
                              "node_mask_shared": {"full": 20.0},
                              "dango_wildtype": {"full": 1.0}},
            "syncs_per_step": {"device_mask_loop": 1596, "device_mask_vectorized": 0},
            "profile_categories": {"replicated_mask_cpu": {"forward": 1.0, "optimizer": 0.01}},
            "brief_comparison": [{"figure": "data pipeline only: DANGO it/s over Lazy it/s",
                                  "brief": 56.0, "measured": 20.0, "holds_in_kind": True}]},
        "04_ddp_scaling": {"gap_decomposition": {"total": 30.0, "steps_ratio": 2.29,
                                                 "per_step_ratio": 12.0, "ddp_factor": 1.09,
                                                 "world_size": 2},
                           "ddp_gather": {"2": {"step_s": 1.0, "toggled_step_s": 1.02}}},
    }


def test_verdict_causes_claims_recommendation():
    found = _synthetic_found()
    causes = verdict.rank_gap_causes(found["03_data_vs_model_timing"], "replicated_mask_cpu",
                                     "dango_wildtype", num_samples=332313,
                                     r04=found["04_ddp_scaling"])
    assert causes[0]["cause"] == "backward"
    assert sum(c["share"] for c in causes) == pytest.approx(1.0)
    cl = {c["claim"]: c for c in verdict.claims(found, 2_423_370, "cpu")}
    assert cl["65 MB of masks per batch (B=28)"]["status"] == verdict.HELD
    assert cl["130 MB of masks per batch with the dual forward"]["status"] == verdict.FAILED
    assert cl["the bottleneck is CPU->GPU transfer"]["status"] == verdict.UNTESTABLE
    assert cl["the optimizer takes 24% of the time"]["status"] == verdict.FAILED
    assert cl["the node-mask shared graph is exact"]["status"] == verdict.HELD
    assert cl["turning off the loss all-gather changes nothing"]["status"] == verdict.HELD
    rec = verdict.recommendation(found)
    assert rec["strategy"] == "node_mask_shared" and rec["speedup_per_sample"] == pytest.approx(5.0)
    assert "CSR" in rec["adoption"]


def test_verdict_missing_results_are_named(tmp_path):
    found, missing = verdict.load_run(tmp_path)
    assert found == {} and len(missing) == 4


def test_memory_fit_without_growth():
    pts = [{"batch_size": 1, "bytes": 5e6}, {"batch_size": 2, "bytes": 4e6}]
    assert memory.fit_largest_batch(pts, 80e9)["largest_batch"] is None
