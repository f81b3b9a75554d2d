import logging

import numpy as np
import pytest
import torch

from workbook_lib.data import snapshots
from workbook_lib.exceptions import SnapshotError


def _check_simple(ei, n):
    assert ei.dtype == torch.int64 and ei.shape[0] == 2
    assert not (ei[0] == ei[1]).any(), "self-loop"
    codes = ei[0] * n + ei[1]
    assert torch.unique(codes).numel() == ei.shape[1], "duplicate edge"
    order = ei[1] * n + ei[0]
    assert (order[1:] > order[:-1]).all(), "not sorted by (dst, src)"


@pytest.mark.parametrize("scale", [0.003, 0.05])
def test_generator_exact_counts(scale):
    spec = snapshots.load_spec("string12")
    edges = snapshots.generate(spec, seed=1, scale=scale)
    sizes = snapshots.scaled_sizes(spec, scale)
    for t, ei in edges.items():
        nodes, e = sizes[t]
        assert ei.shape[1] == e == max(1, round(spec["edge_types"][t]["edges"] * scale))
        assert torch.unique(ei).numel() == nodes
        _check_simple(ei, spec["num_genes"])


def test_full_scale_total_is_the_real_one(tmp_path):
    g = snapshots.load_synthetic("string12", seed=0, scale=1.0, cache_dir=tmp_path)
    assert g.num_edges() == 2_423_370
    spec = snapshots.load_spec("string12")
    for t, info in spec["edge_types"].items():
        assert g.num_edges(t) == info["edges"]
        assert g.nodes_touched(t) == info["nodes"]


def test_heavy_tailed_degrees():
    spec = snapshots.load_spec("string12")
    ei = snapshots.generate(spec, seed=0, scale=0.2)["string12_0_coexpression"]
    deg = torch.bincount(ei[1], minlength=spec["num_genes"]).float()
    deg = deg[deg > 0]
    assert deg.max() > 8 * deg.mean()  # a hub far above the mean


def test_generator_deterministic():
    spec = snapshots.load_spec("string12")
    a = snapshots.generate(spec, seed=3, scale=0.01)
    b = snapshots.generate(spec, seed=3, scale=0.01)
    c = snapshots.generate(spec, seed=4, scale=0.01)
    assert all(torch.equal(a[t], b[t]) for t in a)
    assert any(not torch.equal(a[t], c[t]) for t in a)


def test_cache_roundtrip_and_corruption(tmp_path, caplog):
    g1 = snapshots.load_synthetic("string12", seed=0, scale=0.01, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1 and files[0].with_suffix(".sha256").is_file()
    g2 = snapshots.load_synthetic("string12", seed=0, scale=0.01, cache_dir=tmp_path)
    assert g1.checksum == g2.checksum
    # corrupt the cache: it must be rebuilt (with a warning), never used
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        g3 = snapshots.load_synthetic("string12", seed=0, scale=0.01, cache_dir=tmp_path)
    assert "checksum" in caplog.text
    assert g3.checksum == g1.checksum
    assert snapshots._file_sha256(files[0]) == files[0].with_suffix(".sha256").read_text().strip()


def test_heterodata_loader(tmp_path):
    from torch_geometric.data import HeteroData

    d = HeteroData()
    d["gene"].num_nodes = 5
    d["gene", "physical", "gene"].edge_index = torch.tensor([[0, 1, 3, 4], [1, 0, 2, 2]])
    d["gene", "reg", "gene"].edge_index = torch.tensor([[2], [4]])
    d["reaction"].num_nodes = 3
    d["gene", "gpr", "reaction"].edge_index = torch.tensor([[0], [1]])
    path = tmp_path / "cell.pt"
    torch.save(d, path)
    g = snapshots.load_heterodata(path)
    assert g.num_genes == 5 and set(g.edge_types) == {"physical", "reg"}
    assert g.num_edges() == 5 and g.ignored == ["gene__gpr__reaction"]
    ei = g.edge_index["physical"]
    assert (ei[1, 1:] >= ei[1, :-1]).all()
    # through params too
    from workbook_lib.configs.validation import validate
    assert snapshots.load_snapshot(validate({"snapshot": str(path)})).num_edges() == 5


def test_heterodata_loader_errors(tmp_path):
    from torch_geometric.data import HeteroData

    d = HeteroData()
    d["protein"].num_nodes = 3
    torch.save(d, tmp_path / "x.pt")
    with pytest.raises(SnapshotError, match="'gene'"):
        snapshots.load_heterodata(tmp_path / "x.pt")
    d = HeteroData()
    d["gene"].num_nodes = 3
    d["gene", "r", "gene"].edge_index = torch.tensor([[0], [7]])
    torch.save(d, tmp_path / "y.pt")
    with pytest.raises(SnapshotError, match="outside"):
        snapshots.load_heterodata(tmp_path / "y.pt")
    torch.save({"not": "a graph"}, tmp_path / "z.pt")
    with pytest.raises(SnapshotError, match="HeteroData"):
        snapshots.load_heterodata(tmp_path / "z.pt")
    with pytest.raises(SnapshotError, match="does not exist"):
        snapshots.load_heterodata(tmp_path / "missing.pt")


def test_generate_edge_type_rejects_impossible():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="'edges'"):
        snapshots.generate_edge_type(10, 3, 7, rng)
