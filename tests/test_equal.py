"""``python -m workbook_lib equal SLOW FAST``: a rewrite that computes the same passes, one that
forgets an edge type's deletions is caught (exit 1, naming what differs), parameters that do not
pair are refused (exit 2, naming both sides); the rule itself both ways; and notebook 06 on user
pipelines (trains an exact pair, says why it does not apply to an inexact one)."""
import json
from pathlib import Path

import pytest
import torch

from workbook_lib import cli, runner
from workbook_lib.analysis.equality import (ParameterMismatchError, compare_tensors,
                                            parameter_mapping, parse_renames)
from workbook_lib.configs import params as params_mod
from workbook_lib.running.results import load_result

ROOT = Path(__file__).resolve().parent.parent
LAZY = "examples/lazy_pyg.py:make_pipeline"
NODEMASK = "examples/nodemask_pyg.py:make_pipeline"
DANGO = "examples/dango_pyg.py:make_pipeline"
FORGOT = "tests/rewrites/forgot_edge_type.py:make_pipeline"
CONTROL = "tests/rewrites/forgot_edge_type.py:make_correct"
RENAMED = "tests/rewrites/renamed.py:make_pipeline"


def _equal(capsys, *args):
    rc = cli.main(["equal", *args, "--params", "ci"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_the_nodemask_rewrite_of_example_1_is_equal(capsys, tmp_path):
    rc, out, _err = _equal(capsys, LAZY, NODEMASK, "--json", str(tmp_path / "eq.json"))
    assert rc == 0, out
    assert out.splitlines()[-2].startswith("EQUAL: 'nodemask_pyg' computes the same")
    doc = json.loads((tmp_path / "eq.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    # every parameter of example 1 compared, and the outputs and the loss
    assert set(rows) == {"output", "loss", "embedding", "lins.0.weight", "lins.0.bias",
                         "lins.1.weight", "lins.1.bias", "head.weight", "head.bias"}
    assert all(r["equal"] and r["ratio"] <= 1 for r in rows.values())
    # the last layer's bias gradient cancels (exactly 0 in exact arithmetic: the dual forward
    # subtracts the wildtype pass): its own size is no scale, the rounding probe is
    assert rows["lins.1.bias"]["rel_diff"] > doc["tolerance"]
    assert rows["lins.1.bias"]["probe"] >= rows["lins.1.bias"]["max_abs_diff"]


def test_a_rewrite_that_forgets_one_edge_type_is_caught(capsys):
    rc, out, _err = _equal(capsys, LAZY, FORGOT)
    assert rc == 1
    last = out.splitlines()[-1]
    assert last.startswith("DIFFERENT: 'forgot_edge_type' does NOT compute the same as "
                           "'lazy_pyg'")
    for name in ("output", "embedding", "lins.0.weight"):  # named, with their rows
        assert name in last
        assert any(line.startswith(name) and "DIFFERS" in line for line in out.splitlines())
    # the control: the same hand-written aggregation with the deletions applied is equal, so what
    # the check caught is the forgotten deletion alone
    rc, out, _err = _equal(capsys, LAZY, CONTROL)
    assert rc == 0, out


def test_parameters_that_do_not_pair_are_refused_with_both_sides(capsys):
    rc, out, err = _equal(capsys, LAZY, RENAMED)
    assert rc == 2 and out == ""
    line = err.strip()
    assert "\n" not in line
    assert "only 'lazy_pyg' has embedding, lins.* (4), head.* (2)" in line
    assert "only 'renamed' has net.* (7)" in line and "--map" in line
    rc, out, _err = _equal(capsys, LAZY, RENAMED, "--map", "embedding=net.embedding",
                           "--map", "lins=net.lins", "--map", "head=net.head")
    assert rc == 0, out
    assert "lins.0.weight (fast: net.lins.0.weight)" in out


@pytest.mark.parametrize("args, words", [
    (["examples/lazy_pyg.py", NODEMASK], "is not 'package.module:factory'"),
    ([LAZY, "examples/nothere.py:make"], "does not exist"),
    ([LAZY, LAZY], "the same pipeline"),
    ([LAZY, NODEMASK, "--map", "lins"], "--map expects SLOW_NAME=FAST_NAME"),
    ([LAZY, NODEMASK, "--map", "nothing=x"], "no parameter of 'lazy_pyg'"),
    ([LAZY, NODEMASK, "--batches", "0"], "--batches must be a positive integer"),
    ([LAZY, NODEMASK, "--batches", "1000"], "fewer than 1000 batch(es)"),
])
def test_bad_input_exits_2_in_one_line(capsys, args, words):
    rc, out, err = _equal(capsys, *args)
    assert rc == 2 and words in err and err.count("\n") == 1, err


# ------------------------------------------------------------------ the rule, both ways
def test_mapping_refuses_missing_extra_and_shapes_and_applies_renames():
    slow = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    same = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    assert parameter_mapping(slow, same) == {n: n for n, _ in slow.named_parameters()}
    wide = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 1))
    with pytest.raises(ParameterMismatchError, match=r"shapes differ: 0.weight \[4, 3\] vs "
                                                     r"0.weight \[5, 3\]") as ei:
        parameter_mapping(slow, wide)
    assert set(ei.value.shapes) == {"0.weight", "0.bias", "1.weight"}
    wrapped = torch.nn.ModuleDict({"net": same})
    with pytest.raises(ParameterMismatchError) as ei:
        parameter_mapping(slow, wrapped)
    assert len(ei.value.missing) == 4 and ei.value.extra[0] == "net.0.bias"
    assert parameter_mapping(slow, wrapped, parse_renames(["0=net.0", "1=net.1"]))["1.bias"] \
        == "net.1.bias"
    # the longest prefix wins; a whole name too
    assert parameter_mapping(slow, wrapped, {"0": "net.0", "1": "net.1",
                                             "1.bias": "net.1.bias"})["1.weight"] == "net.1.weight"
    with pytest.raises(ValueError, match="twice"):
        parse_renames(["a=b", "a=c"])


def test_compare_tensors_within_and_beyond_rounding():
    a = torch.tensor([1.0, -2.0, 3.0])
    assert compare_tensors("x", "output", a, a * (1 + 1e-6), 2e-5).equal
    assert not compare_tensors("x", "output", a, a * (1 + 1e-3), 2e-5).equal
    # a value that cancels to rounding: its own size is no scale; the probe's displacement is
    g = torch.tensor([1e-7, -2e-7])
    off = g + 1e-7
    assert not compare_tensors("g", "gradient", g, off, 2e-5).equal
    row = compare_tensors("g", "gradient", g, off, 2e-5, probe=g + 3e-7)
    assert row.equal and row.allowed == pytest.approx(3e-7) and row.ratio < 1
    assert not compare_tensors("g", "gradient", g, g + 1e-5, 2e-5, probe=g + 3e-7).equal
    # shapes, one-sided gradients, non-finite values
    assert compare_tensors("x", "output", a, a.unsqueeze(1), 2e-5).equal  # [B] vs [B, 1]
    assert not compare_tensors("x", "output", a, a[:2], 2e-5).equal
    assert compare_tensors("p", "gradient", None, None, 2e-5).equal
    assert "only in the slow" in compare_tensors("p", "gradient", a, None, 2e-5).note
    assert not compare_tensors("x", "output", a, a * float("nan"), 2e-5).equal


# ------------------------------------------------------------------ notebook 06, user pipelines
def _run_06(tmp_path, pipelines):
    _src, raw = params_mod.read_params_file(ROOT / "params" / "ci.yaml")
    p = params_mod.validate({**raw, "strategies": [], "pipelines": pipelines})
    outcomes = runner.run_notebooks(p, tmp_path, only=["06"], progress=False, log_output=False)
    assert [o.status for o in outcomes] == ["ok"]
    return load_result(tmp_path, "06_adopt_fix"), (tmp_path / "06_adopt_fix.html").read_text()


def test_06_trains_a_user_pipeline_beside_its_exact_rewrite(tmp_path):
    a, html = _run_06(tmp_path, [LAZY, NODEMASK])
    assert a.applicable and a.mode == "pipelines"
    assert a.names == {"lazy_pyg": "lazy_pyg", "nodemask_pyg": "nodemask_pyg"}
    assert a.equality.equal and a.equality.slow == "lazy_pyg"  # the check ran first
    n = a.steps + a.warmup_steps
    assert [len(v) for v in a.losses.values()] == [n, n]
    assert a.max_rel_diff <= a.tolerance  # the same training
    assert a.losses["lazy_pyg"] != a.losses["nodemask_pyg"] or a.max_rel_diff == 0
    assert a.speedup.n >= 3
    assert "same training" in html and "do not apply" not in html


def test_06_says_why_it_does_not_apply_to_an_inexact_fast_pipeline(tmp_path):
    a, html = _run_06(tmp_path, [LAZY, DANGO])
    assert not a.applicable and a.losses == {} and a.speedup is None
    assert "'dango_pyg', is not exact" in a.reason and "'lazy_pyg'" in a.reason
    assert "06 does not apply here" in html and "is not exact" in html
