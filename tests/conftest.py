import logging
import os
from pathlib import Path

import pytest
import torch

from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.configs import params as params_mod

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WORKBOOK_PROGRESS", "0")


@pytest.fixture
def ci_params():
    return params_mod.load_params_file(ROOT / "params" / "ci.yaml")


def make_graph(num_genes=12, types=None, seed=0) -> CellGraph:
    """A small random directed graph with a few edge types (no self-loops, no duplicates)."""
    g = torch.Generator().manual_seed(seed)
    types = types or {"a": 30, "b": 20, "c": 8}
    ei = {}
    for t, e in types.items():
        codes = set()
        while len(codes) < e:
            s, d = torch.randint(0, num_genes, (2,), generator=g).tolist()
            if s != d:
                codes.add((s, d))
        arr = torch.tensor(sorted(codes, key=lambda x: (x[1], x[0]))).T.contiguous() if codes \
            else torch.empty(2, 0, dtype=torch.long)
        ei[t] = arr
    return CellGraph(name="tiny", num_genes=num_genes, edge_index=ei, source="test",
                     checksum=content_checksum(num_genes, ei))


@pytest.fixture(autouse=True)
def _quiet_logs():
    logging.getLogger("papermill").setLevel(logging.WARNING)


def builtin_pipeline(graph, name, pert, *, batch_size=4, hidden=4, layers=2, dual=True,
                     **strategy_kw):
    """A built-in strategy with a small PerturbGIN as a pipeline (for loop tests)."""
    from workbook_lib.pipelines.builtin import BuiltinPipeline
    from workbook_lib.strategies import make_strategy
    from workbook_lib.strategies.model import PerturbGIN

    s = make_strategy(name, graph, **strategy_kw)
    m = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=layers)
    return BuiltinPipeline(s, m, pert, batch_size, dual=dual)


def write_trace(tmp_path, events):
    """A Chrome trace of complete CPU events ``(name, ts, dur, tid)`` (microseconds) in
    ``tmp_path/t.json``."""
    import json

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": n, "ts": ts, "dur": d, "pid": 1, "tid": tid, "cat": "cpu_op"}
        for n, ts, d, tid in events]}))
    return p


def write_notebook(path, *cells):
    """A notebook whose first cell is the workbook's parameters cell (tagged for papermill),
    then ``cells``, on the python3 kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}}
    p = nbformat.v4.new_code_cell(params_mod.parameters_cell())
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))
