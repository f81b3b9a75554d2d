"""Every bad input is refused before any work: exit status 2, one line naming the key, no
traceback, no run folder; the notebooks' set-up refuses the same params with the same key.

The CLI is called in-process (``cli.main``), so the whole table runs in seconds."""
from pathlib import Path

import pytest
import torch

from workbook_lib import cli
from workbook_lib.configs.loading import MAX_MESSAGE
from workbook_lib.configs.validation import load_params_file

ROOT = Path(__file__).resolve().parent.parent

def _laughs(tmp):
    """A ~600-byte billion laughs under 'strategies' (3 x 9**8 strings once expanded)."""
    doc = "strategies:\n  - &a0 [node_mask_shared, node_mask_shared, node_mask_shared]\n"
    for i in range(1, 9):
        doc += f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    f = tmp / "laughs.yaml"
    f.write_text(doc)
    assert len(doc) < 700
    return f


def _shallow_laughs(tmp):
    """The same within the nesting a params value may have: 9**6 entries once expanded."""
    doc = "x: &a0 [node_mask_shared, node_mask_shared, node_mask_shared]\n"
    for i in range(1, 6):
        doc += f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    doc += "strategies: [" + ", ".join(["*a5"] * 9) + "]\n"
    f = tmp / "laughs6.yaml"
    f.write_text(doc)
    return f


def _hetero(tmp, name, *, num_nodes=50, edge_index="ok", attr="edge_index"):
    from torch_geometric.data import HeteroData

    d = HeteroData()
    d["gene"].num_nodes = num_nodes
    if edge_index == "ok":
        ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    elif edge_index == "empty":
        ei = torch.empty(2, 0, dtype=torch.long)
    elif edge_index == "nan":
        ei = torch.tensor([[0.0, float("nan")], [1.0, 2.0]])
    setattr(d["gene", "physical", "gene"], attr, ei)
    path = tmp / f"{name}.pt"
    torch.save(d, path)
    return str(path)


def _file(tmp, name, text):
    f = tmp / name
    f.write_text(text)
    return str(f)


# (id, make(tmp) -> CLI args after `run`, the key the line must name)
CASES = [
    # 6: accepted by the CLI, then refused by every notebook: one validation now
    ("nan probability", lambda t: ["--set", "perturbation_k={3: .nan}"], "perturbation_k"),
    ("inf probability", lambda t: ["--set", "perturbation_k={3: .inf}"], "perturbation_k"),
    ("exactness above genes", lambda t: ["--set", "exactness_genes=7000"], "exactness_genes"),
    ("empty edge_index file", lambda t: ["--set", "snapshot=" + _hetero(t, "empty",
                                                                       edge_index="empty")],
     "exactness_genes"),
    # 7: tracebacks
    ("scale inf", lambda t: ["--set", "scale=.inf"], "scale"),
    ("scale nan", lambda t: ["--set", "scale=.nan"], "scale"),
    ("scale 1e6", lambda t: ["--set", "scale=1e6"], "scale"),
    ("scale 10**400", lambda t: ["--set", "scale=" + "1" + "0" * 400], "scale"),
    ("edge type without edge_index", lambda t: ["--set", "snapshot=" + _hetero(
        t, "noei", attr="weights")], "snapshot"),
    ("50,000-deep list", lambda t: ["--params", _file(t, "deep.yaml", "batch_sizes: "
                                                      + "[" * 50000 + "]" * 50000)],
     "batch_sizes"),
    ("50,000-deep --set", lambda t: ["--set", "batch_sizes=" + "[" * 50000 + "]" * 50000],
     "batch_sizes"),
    ("NaN float edge_index", lambda t: ["--set", "snapshot=" + _hetero(t, "nan",
                                                                      edge_index="nan")],
     "snapshot"),
    # 8: accepted and failing later: bounded
    ("seed 2**80", lambda t: ["--set", f"seed={2 ** 80}"], "seed"),
    ("seed 2**32", lambda t: ["--set", f"seed={2 ** 32}"], "seed"),
    ("one sweep_edges", lambda t: ["--set", "sweep_edges=[50000]"], "sweep_edges"),
    ("repeated sweep_edges", lambda t: ["--set", "sweep_edges=[50000, 50000, 100000]"],
     "sweep_edges"),
    ("one sweep_hidden", lambda t: ["--set", "sweep_hidden=[32]"], "sweep_hidden"),
    ("one memory_batch_sizes", lambda t: ["--set", "memory_batch_sizes=[4]"],
     "memory_batch_sizes"),
    ("batch 10**12", lambda t: ["--set", f"batch_sizes=[1, {10 ** 12}]"], "batch_sizes"),
    ("lazy batch 10**12", lambda t: ["--set", f"batch_size_lazy={10 ** 12}"], "batch_size_lazy"),
    ("int beyond int64", lambda t: ["--set", f"num_samples={2 ** 70}"], "num_samples"),
    # 9: silently accepted
    ("duplicate key", lambda t: ["--params", _file(t, "dup.yaml", "hidden: 8\nhidden: 16\n")],
     "hidden"),
    ("duplicate k", lambda t: ["--set", "perturbation_k={3: 0.5, 3: 0.5}"], "perturbation_k"),
    ("empty --out", lambda t: ["--out", ""], "--out"),
    # 10: refused, but after creating the run folder
    ("snapshot does not load", lambda t: ["--set", "snapshot=" + _file(t, "bad.pt", "garbage")],
     "snapshot"),
    ("snapshot holds no HeteroData", lambda t: ["--set", "snapshot=" + _saved(t)], "snapshot"),
    ("cache_dir is a file", lambda t: ["--set", "cache_dir=" + _file(t, "f", "x")], "cache_dir"),
    ("cache_dir cannot be made", lambda t: ["--set", "cache_dir=/proc/no/cache"], "cache_dir"),
    ("params path is a directory", lambda t: ["--params", str(t)], "is a directory"),
    ("--out is a file", lambda t: ["--out", _file(t, "o.txt", "x")], "--out"),
    # 11: a billion laughs, a huge value
    ("billion laughs", lambda t: ["--params", str(_laughs(t))], "strategies"),
    ("billion laughs, shallow", lambda t: ["--params", str(_shallow_laughs(t))], "x"),
    ("billion laughs in --set", lambda t: ["--set", "strategies=[&a [a, a, a, a, a, a, a, a], "
                                           + ", ".join(["[*a, *a, *a, *a, *a, *a, *a]"] * 300)
                                           + "]"], "strategies"),
    ("huge list", lambda t: ["--set", "strategies=[" + ", ".join(["x"] * 20000) + "]"],
     "strategies"),
    ("long unknown value", lambda t: ["--set", "device=" + "x" * 100000], "device"),
    ("snapshot name too long", lambda t: ["--set", "snapshot=" + "x" * 5000], "snapshot"),
    ("snapshot path too long", lambda t: ["--set", f"snapshot={t}/{'y' * 5000}.pt"], "snapshot"),
    ("cache_dir too long", lambda t: ["--set", f"cache_dir={t}/{'y' * 5000}"], "cache_dir"),
    ("rdzv_endpoint not host:port", lambda t: ["--set", "rdzv_endpoint=" + "y" * 50],
     "rdzv_endpoint"),
    ("nnodes without rendezvous", lambda t: ["--set", "nnodes=2"], "rdzv_endpoint"),
    ("ddp_timeout_s beyond a timedelta", lambda t: ["--set", "ddp_timeout_s=1.0e300"],
     "ddp_timeout_s"),
    ("ddp_timeout_s shorter than the heartbeats", lambda t: ["--set", "ddp_timeout_s=1"],
     "ddp_timeout_s"),
    ("bucket_cap_mb beyond int64 bytes", lambda t: ["--set", "bucket_cap_mb=1.0e300"],
     "bucket_cap_mb"),
    # and the ones that always were
    ("unknown key", lambda t: ["--set", "hiden=3"], "hiden"),
    ("wrong type", lambda t: ["--set", "layers=two"], "layers"),
    ("binary params", lambda t: ["--params", _bin(t)], "not a text file"),
    # found by a user trial: 05 alone started, failed at its third cell, and its hint spelled
    # every key of the params as a --set
    ("05 without 03", lambda t: ["--only", "05"], "05 needs notebook 03's timings"),
]


def _saved(tmp):
    path = tmp / "tensor.pt"
    torch.save(torch.zeros(3), path)
    return str(path)


def _bin(tmp):
    path = tmp / "b.yaml"
    path.write_bytes(bytes(range(256)))
    return str(path)


@pytest.mark.parametrize("make,key", [(m, k) for _, m, k in CASES], ids=[c[0] for c in CASES])
def test_bad_input_refused_in_one_line_before_any_work(tmp_path, capsys, make, key):
    out = tmp_path / "run"
    args = make(tmp_path)
    argv = ["run", "--params", "ci", "--out", str(out), "--quiet", *args]
    if args[0] == "--params":
        argv = ["run", "--out", str(out), "--quiet", *args]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err[:500]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[:2000]
    assert len(lines[0]) <= MAX_MESSAGE + 7, len(lines[0])
    assert key in lines[0], lines[0]
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("argv", [["bench", "--out", ""], ["stability", "--out", ""],
                                  ["slurm", "--out-dir", ""], ["slurm", "--run-dir", " "],
                                  ["params", "--set", "x=1", "--set", "seed=-1"],
                                  ["stability", "--runs", "1", "--out", "/nonexistent/s"],
                                  ["stability", "--tolerance", "nan", "--out", "/nonexistent/s"],
                                  ["stability", "--only", "99", "--out", "/nonexistent/s"],
                                  ["selftest", "--device", "cpu", "--only", "nosuch"],
                                  ["html", str(ROOT / "pyproject.toml"), "--out",
                                   "/nonexistent/h.html"],
                                  ["bench", "--params", "ci", "--out", str(ROOT / "notebooks")]])
def test_other_commands_refuse_in_one_line(capsys, argv):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


NOTEBOOK_CASES = [
    ({"perturbation_k": {3: float("nan")}}, "perturbation_k"),
    ({"exactness_genes": 7000}, "exactness_genes"),
    ({"scale": float("inf")}, "scale"),
    ({"scale": 1e6}, "scale"),
    ({"seed": 2 ** 80}, "seed"),
    ({"sweep_edges": [50000]}, "sweep_edges"),
    ({"memory_batch_sizes": [4]}, "memory_batch_sizes"),
    ({"batch_sizes": [1, 10 ** 12]}, "batch_sizes"),
    ({"batch_sizes": "[1, 1000000000000]"}, "batch_sizes"),  # as papermill -p injects it
]


@pytest.mark.parametrize("bad,key", NOTEBOOK_CASES)
def test_notebooks_refuse_what_the_cli_refuses(tmp_path, bad, key):
    """A notebook's set-up validates with the same schema and snapshot checks as the CLI."""
    from workbook_lib.exceptions import ParamsError
    from workbook_lib.running.notebook import setup

    ns = {**load_params_file("ci"), **bad, "run_dir": str(tmp_path / "run")}
    with pytest.raises(ParamsError) as e:
        setup(ns)
    assert e.value.key == key and key in str(e.value)
    assert not (tmp_path / "run").exists()


def test_empty_edge_snapshot_refused_alike_by_notebook(tmp_path):
    from workbook_lib.exceptions import ParamsError
    from workbook_lib.running.notebook import setup

    ns = {**load_params_file("ci"), "snapshot": _hetero(tmp_path, "e", edge_index="empty"),
          "run_dir": str(tmp_path / "run")}
    with pytest.raises(ParamsError, match="exactness_genes"):
        setup(ns)
    ns["exactness_genes"] = 10  # fits the 50 genes: accepted
    assert setup(ns).graph.num_genes == 50


@pytest.mark.parametrize("argv, words", [
    (["run", "--params", "ci", "--set", "scale=-1"], "'scale' must be positive"),
    (["equal", "nosuch.py:make", "other.py:make"], "nosuch.py does not exist"),
    (["equal", "node_mask_shared", "dango_wildtype", "--map", "x"], "--map expects"),
])
def test_the_command_line_refuses_before_pytorch_loads(argv, words):
    """A mistyped command line gets its one line without waiting for PyTorch (2 to 3 s): the
    arguments and params are checked first, in a fresh interpreter that then says whether
    PyTorch was imported."""
    import subprocess
    import sys

    code = ("import sys; from workbook_lib.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-1500:])
    assert words in r.stderr and r.stderr.count("\n") == 1, r.stderr
