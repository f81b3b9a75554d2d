import numpy as np
import pytest
import torch

from workbook_lib.studies import inventory
from workbook_lib.data.perturbations import node_keep_mask, sample_perturbations
from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.results.inventory import InventoryResult


def test_sampler_distinct_seeded_padded():
    a = sample_perturbations(50, 3, 100, seed=1)
    assert a.shape == (100, 3)
    assert all(len(set(r.tolist())) == 3 for r in a)
    assert torch.equal(a, sample_perturbations(50, 3, 100, seed=1))
    assert not torch.equal(a, sample_perturbations(50, 3, 100, seed=2))
    m = sample_perturbations(50, {1: 0.5, 3: 0.5}, 400, seed=0)
    n_valid = (m >= 0).sum(1)
    assert set(n_valid.tolist()) == {1, 3}
    assert ((m[:, 1:] == -1).all(1) == (n_valid == 1)).all()
    assert sample_perturbations(50, 0, 4).shape == (4, 0)
    with pytest.raises(ValueError, match="num_genes"):
        sample_perturbations(5, 6, 1)


def test_node_keep_mask():
    keep = node_keep_mask(torch.tensor([[1, -1], [0, 3]]), 4)
    assert keep.tolist() == [[True, False, True, True], [False, True, True, False]]


@pytest.fixture
def hand_graph():
    # 4 genes; type a: 0->1, 1->2, 2->3 ; type b: 3->0
    ei = {"a": torch.tensor([[0, 1, 2], [1, 2, 3]]), "b": torch.tensor([[3], [0]])}
    return CellGraph("hand", 4, ei, "test", content_checksum(4, ei))


def test_inventory_arithmetic(hand_graph):
    rows = inventory.edge_type_table(hand_graph)
    assert rows[0] == {"name": "a", "nodes": 4, "edges": 3, "bytes_int64": 48, "bytes_int32": 24}
    assert rows[1]["nodes"] == 2 and rows[1]["bytes_int64"] == 16
    # incidence: 2 entries/edge * 8 B + (4+1) offsets * 8 B, per type
    assert inventory.incidence_cache_bytes(hand_graph) == (2 * 3 * 8 + 40) + (2 * 1 * 8 + 40)
    ps = inventory.per_sample_bytes(hand_graph, mean_k=1, mean_removed_edges=2)
    assert ps == {"perturbation_indices": 8, "removed_edge_indices": 16, "edge_masks": 4,
                  "replicated_edge_index": 64}
    pb = inventory.per_batch_bytes(ps, [1, 28])
    assert pb["edge_masks"] == {1: 4, 28: 112}
    assert pb["replicated_edge_index"][28] == 28 * 64
    assert inventory.dataset_bytes(ps, 10)["edge_masks"] == 40


def test_removed_edges_and_hops(hand_graph):
    pert = torch.tensor([[1], [0], [3]])
    assert inventory.removed_edge_counts(hand_graph, pert).tolist() == [2, 2, 2]
    cov = inventory.hop_coverage(hand_graph, torch.tensor([[1]]), hops=3)
    # undirected chain 0-1-2-3 plus 3-0 (a 4-cycle): from gene 1, hop1 {0,1,2}, hop2 all
    np.testing.assert_allclose(cov[0], [0.75, 1.0, 1.0])


def test_inventory_measures_what_strategy_2_carries():
    from conftest import make_graph
    from workbook_lib.configs.validation import validate

    g = make_graph(num_genes=40, types={"x": 200, "y": 120}, seed=7)
    p = validate({"num_perturbations": 8, "batch_sizes": [1, 4]})
    r = inventory.inventory(p, g)
    assert r.measured_batch_mask_bytes_per_sample == g.num_edges()  # 1 byte per edge
    assert r.measured_incidence_cache_bytes == inventory.incidence_cache_bytes(g)
    assert r.real_size is None  # no spec: a test graph
    back = InventoryResult.from_json(r.to_json())
    assert back.hop_coverage[2].median == r.hop_coverage[2].median


def test_headline_quotes_the_investigations_batch_only_when_its_strategies_ran():
    from conftest import make_graph
    from workbook_lib.configs.validation import validate
    from workbook_lib.report.inventory_view import headline

    g = make_graph(num_genes=40, types={"x": 200, "y": 120}, seed=7)
    ran = inventory.inventory(validate({"num_perturbations": 8, "batch_sizes": [1, 28]}), g)
    assert ran.builtin and "per batch of 28" in headline(ran)
    own = inventory.inventory(validate({"num_perturbations": 8, "batch_sizes": [1, 28],
                                        "strategies": [], "pipelines": ["a:f", "b:g"]}), g)
    assert not own.builtin  # a user's own pipelines: their batch is their own
    assert "per batch" not in headline(own) and "boolean edge masks would take" in headline(own)
    # a user's pipeline may build its own graph: the figures are said to be the snapshot's
    assert headline(own).startswith("the snapshot's ") and not headline(ran).startswith("the")
    assert InventoryResult.from_json(own.to_json()).builtin is False


def test_01s_locality_words_follow_its_figures_both_ways():
    """Found by a user trial: at ci scale 01 said a deletion 'changes most embeddings' after two
    layers, then that 0% of genes had changed by layer 2 'so later layers need the full
    product'. Each conclusion now follows its figure (more than half of the genes, or not)."""
    import copy

    from conftest import make_graph
    from workbook_lib.configs.validation import validate
    from workbook_lib.report.inventory_view import footprint_text, locality_text
    from workbook_lib.results.stat import Stat

    g = make_graph(num_genes=40, types={"x": 200, "y": 120}, seed=7)
    r = inventory.inventory(validate({"num_perturbations": 8, "batch_sizes": [1, 28]}), g)
    few, most = copy.deepcopy(r), copy.deepcopy(r)
    few.hop_coverage[2] = Stat.from_samples([0.01] * 5)
    most.hop_coverage[2] = Stat.from_samples([0.8] * 5)
    assert "reaches fewer than half of them in two layers" in locality_text(few).data
    assert "most embeddings" not in locality_text(few).data
    assert "can change most embeddings" in locality_text(most).data
    for row in few.footprint:
        if (row.layer, row.edge_type) == (2, "all"):
            row.genes = Stat.from_samples([0.0] * 5)
    for row in most.footprint:
        if (row.layer, row.edge_type) == (2, "all"):
            row.genes = Stat.from_samples([0.9] * 5)
    assert "fewer than half" in footprint_text(few).data
    assert "need the full product" not in footprint_text(few).data
    assert "later layers need the full product" in footprint_text(most).data
