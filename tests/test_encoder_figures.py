"""03's encoder figures: a pipeline's ``shared_encoder`` on B masked copies against its
conversion (exact on the timed batches, both timed interleaved, the floor counted), a refusal
kept as one line, a pipeline without an encoder left out; and 05's forward advice carrying them."""
from pathlib import Path

import torch
from torch import nn
from torch_geometric.nn import GATConv

from workbook_lib.configs.loading import read_params_file
from workbook_lib.configs.validation import validate
from workbook_lib.pipelines import build_pipeline
from workbook_lib.results.timing import EncoderFigures, Growth, LoopStudy
from workbook_lib.results.stat import Stat
from workbook_lib.studies.timing.encoder import encoder_figures, encoders_of, masked_copies

from conftest import make_graph

ROOT = Path(__file__).resolve().parent.parent
SPECS = [f"examples/{n}.py:make_pipeline" for n in ("torchcell_pyg", "dango_pyg")]
FAST = dict(warmup=0, min_rounds=3, target=0.9, max_time_s=0.5)


def _params(**kw):
    _src, base = read_params_file(ROOT / "params" / "ci.yaml")
    base.update(pipelines=SPECS, hidden=8, layers=2, perturbation_k=2, batch_size_lazy=4, **kw)
    return validate(base)


def test_masked_copies_drop_the_deleted_genes_edges_and_rows():
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    x = torch.ones(4, 2)
    xs, g, keep = masked_copies(x, ei, torch.tensor([[1, -1], [-1, -1]]))
    assert xs.shape == (8, 2) and xs[1].abs().sum() == 0 and xs[5].abs().sum() == 2
    assert g.tolist() == [[2, 3, 4, 5, 6, 7], [3, 0, 5, 6, 7, 4]]  # sample 0 keeps 2->3, 3->0
    assert keep.tolist() == [[True, False, True, True], [True] * 4]


def test_a_torchcell_shaped_encoder_is_timed_against_its_conversion():
    g = make_graph(num_genes=40, types={"a": 120, "b": 60}, seed=3)
    pipe = build_pipeline(_params(), "torchcell_pyg", g, "cpu")
    fig = encoder_figures(pipe, device=torch.device("cpu"), **FAST)
    assert not fig.blocked and fig.batch_size == 4 and fig.num_genes == 40
    assert fig.max_rel_error < 1e-5  # the conversion computes what the copies do
    assert fig.masked_copies.n >= 3 and fig.converted.n >= 3 and fig.ratio.median > 0
    assert fig.floor_sparse_macs > 0 and fig.floor_dense_macs > 0
    assert "GINConv" in fig.explain and "changed rows" in fig.explain
    back = EncoderFigures.from_json(fig.to_json())
    assert back.converted.median == fig.converted.median and back.explain == fig.explain


class _GatEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = GATConv(8, 8)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


class _GatPipeline:
    batch_size = 2

    def __init__(self):
        self.encoder, self.x = _GatEncoder(), torch.randn(6, 8)
        self.edges = torch.tensor([[0, 1, 2], [1, 2, 3]])

    def dataset(self):
        return [torch.tensor([i % 6, -1]) for i in range(4)]

    def collate(self, items):
        return torch.stack(items)

    def to_device(self, batch, non_blocking=False):
        return batch

    def shared_encoder(self, batch):
        return self.encoder, self.x, self.edges, batch


def test_an_encoder_that_does_not_convert_is_one_line_and_no_figures():
    fig = encoder_figures(_GatPipeline(), device=torch.device("cpu"), **FAST)
    assert fig.blocked and "\n" not in fig.blocked and "conv" in fig.blocked
    assert "GATConv" in fig.blocked and fig.converted is None


def test_pipelines_without_an_encoder_or_whose_encoder_raises():
    class NoEncoder(_GatPipeline):
        def shared_encoder(self, batch):
            return None

    class Raises(_GatPipeline):
        def shared_encoder(self, batch):
            raise RuntimeError("no encoder today")

    failures = {}
    got = encoders_of({"none": NoEncoder(), "raises": Raises()}, device=torch.device("cpu"),
                      failures=failures, **FAST)
    assert got == {} and list(failures) == ["raises"] and failures["raises"].figures_kept
    assert "no encoder today" in failures["raises"].line()


def test_a_deleted_without_one_row_per_sample_is_refused_naming_its_shape():
    """Found by a user trial: a transposed ``deleted`` ([k, B]) converted and was timed as a
    batch of k, its figures quoted beside the pipeline's batch of B."""
    class Transposed(_GatPipeline):
        batch_size = 3

        def dataset(self):
            return [torch.tensor([i % 6, -1]) for i in range(6)]

        def shared_encoder(self, batch):
            return self.encoder, self.x, self.edges, batch.t()

    failures = {}
    assert encoders_of({"t": Transposed()}, device=torch.device("cpu"), failures=failures,
                       **FAST) == {}
    assert "'deleted' of shape [2, 3]; it must be [B, k] with B = 3" in failures["t"].line()


def _cause(encoder: EncoderFigures | None):
    from workbook_lib.results.verdict import Cause
    from workbook_lib.studies.verdict.advice import advise

    st = Stat.from_samples([0.002] * 5)
    grow = Growth(stage="forward", batch_sizes=(8, 4), per_sample=st,
                  at_batch=Stat.from_samples([0.02] * 5), share=0.8, grows=True)
    c = Cause("forward", "12 ms per step against 1 ms", 1.0, 0.1, 0.9, 0.9, "measured",
              effect="adds", stage="forward", growth=grow)  # as set_shares marks it
    advise([c], "cpu", encoder=encoder)
    return c.advice


def test_the_forward_advice_carries_the_conversion_figures_or_its_refusal():
    st = Stat.from_samples([0.040, 0.041, 0.039]), Stat.from_samples([0.010, 0.011, 0.009])
    fig = EncoderFigures(batch_size=4, masked_copies=st[0], converted=st[1],
                         ratio=Stat.from_samples([4.0, 3.9, 4.1]), floor_sparse_macs=2e6,
                         floor_dense_macs=3e7, all_changed_from="convs.1[a]", num_genes=40)
    words = _cause(fig)
    assert "one pass over one shared graph" in words
    assert "your encoder converts: 40 -> 10 ms per batch of 4" in words
    assert "(4x, IQR 0.1, n = 3, same rounds;" in words  # its spread and n, as 03 gives them
    assert "every gene changes from convs.1[a]" in words
    assert "not shown to be faster" not in words
    # the same advice where the conversion measured no faster: the figures do not bear it out
    even = EncoderFigures(batch_size=4, masked_copies=st[0], converted=st[0],
                          ratio=Stat.from_samples([1.01, 0.97, 1.03, 0.99, 1.02]),
                          floor_sparse_macs=2e6, floor_dense_macs=3e7, num_genes=40)
    assert "your encoder converted is not shown to be faster at batch 4 (1.01x, quartiles " \
           "0.99-1.02): these figures do not show that one shared pass pays" in _cause(even)
    blocked = _cause(EncoderFigures(batch_size=4, blocked="conv (GATConv): attention"))
    assert "your encoder does not convert: conv (GATConv): attention" in blocked
    assert "converts:" not in _cause(None) and "does not convert" not in _cause(None)


def test_a_pipeline_that_runs_its_encoder_converted_is_not_told_to_convert_it():
    """A user trial: 03 showed "masked copies 35.1 ms | converted 9.01 ms | 3.9x" for a pipeline
    whose forward already ran the converted form. 03 now says its forward runs converted, and
    05 does not advise one shared pass to a pipeline making one: it says what it runs."""
    from workbook_lib.studies.verdict.advice import graph_work

    g = make_graph(num_genes=40, types={"a": 120, "b": 60}, seed=3)
    p = _params().replace(pipelines=[f"examples/{n}.py:make_pipeline" for n in (
        "torchcell_pyg", "torchcell_converted")],
        gap_strategies=["torchcell_pyg", "torchcell_converted"])
    copies = build_pipeline(p, "torchcell_pyg", g, "cpu")
    twin = build_pipeline(p, "torchcell_converted", g, "cpu")
    assert not encoder_figures(copies, device=torch.device("cpu"), **FAST).runs_converted
    # a converted copy the model holds and its training forward does not run (a review)
    from workbook_lib.nodemask import convert

    enc, _x, graph, _d = copies.shared_encoder(copies.to_device(copies.collate(
        [copies.dataset()[i] for i in range(4)]), False))
    copies.model.spare = convert(enc, graph)
    assert not encoder_figures(copies, device=torch.device("cpu"), **FAST).runs_converted
    fig = encoder_figures(twin, device=torch.device("cpu"), **FAST)
    assert fig.runs_converted and not fig.blocked
    assert graph_work(None, fig, False) == ""  # (no other evidence of graph work here)
    words = _cause(fig)
    assert "one pass over one shared graph" not in words and "converts:" not in words
    from workbook_lib.results.verdict import Cause
    from workbook_lib.studies.verdict.advice import advise

    c = Cause("forward", "12 ms per step against 1 ms", 1.0, 0.1, 0.9, 0.9, "measured",
              effect="adds", stage="forward")
    advise([c], "cpu", encoder=fig)
    assert "your encoder runs converted already (workbook_lib.nodemask.convert); 03 timed it " \
        "alone, without a readout, converted again: " in c.finding
    assert "on masked copies" in c.finding


def test_06_trains_the_torchcell_example_beside_its_converted_twin():
    """Example 4 (B masked copies) and example 5 (converted) from one seed: the check before
    training (what `equal` runs) says equal, and the loss curves agree within float32
    rounding."""
    from workbook_lib.studies.adoption import adopt, check_pair

    g = make_graph(num_genes=30, types={"a": 90, "b": 40}, seed=5)
    specs = [f"examples/{n}.py:make_pipeline" for n in ("torchcell_pyg", "torchcell_converted")]
    _src, base = read_params_file(ROOT / "params" / "ci.yaml")
    base.update(pipelines=specs, strategies=[], hidden=8, layers=2, perturbation_k=2,
                batch_size_lazy=4, adopt_steps=6, warmup=1)
    p = validate(base)
    pair = check_pair(p, g, torch.device("cpu"))
    assert pair.applicable, pair.reason
    assert pair.equality.equal
    # a user trial: the converted form's host plan (+-1 values made in float32, cast at their
    # use) sent equal to float32 ("computes in another dtype (aten.lift_fresh ...)")
    assert pair.equality.precision == "float64", pair.equality.precision_note
    res = adopt(p, pair, torch.device("cpu"), "cpu", graph=g)
    assert res.applicable and len(res.losses) == 2
    curves = list(res.losses.values())
    assert len(curves[0]) == len(curves[1]) >= 6
    assert res.max_rel_diff <= res.tolerance, (res.max_rel_diff, res.tolerance)
    assert res.speedup is not None and res.speedup.n >= 1


def test_the_forward_advice_projects_what_the_conversion_leaves_of_the_gap():
    from workbook_lib.studies.verdict.advice import gap_left

    st = Stat.from_samples([0.040, 0.041, 0.039]), Stat.from_samples([0.010, 0.011, 0.009])
    fig = EncoderFigures(batch_size=4, masked_copies=st[0], converted=st[1],
                         ratio=Stat.from_samples([4.0, 3.9, 4.1]), num_genes=40)
    # 7.5 ms saved per sample, 4 samples a step, 100 steps: 3 s off a 5 s epoch against 0.5 s
    words = gap_left(fig, 100, (5.0, 0.5), 4)
    assert "saves 30 ms of each 50 ms step" in words and "about 4x of 10x" in words
    assert "projected from these figures, not measured" in words
    assert gap_left(fig, 100, (2.0, 0.5), 8) == ""  # a saving beyond the epoch: no projection
    assert gap_left(fig, None, (5.0, 0.5), 4) == ""
    assert gap_left(EncoderFigures(batch_size=4, blocked="GATConv"), 100, (5.0, 0.5), 4) == ""


def test_one_shared_pass_is_advised_only_where_the_figures_show_graph_work_per_sample():
    """Found by a user trial: a pipeline already making one SAGEConv pass over one shared graph,
    whose forward grew with the batch in a dense per-sample readout (`dense_project_pool`, under
    `Linear.forward`), was told to make one pass over one shared graph. A forward that grows is
    told so only with what shows graph work: its largest site in graph code, a declared encoder,
    or a built-in strategy carrying graph copies; else no such advice (both ways)."""
    from workbook_lib.results.verdict import Cause, CodeSite
    from workbook_lib.studies.verdict.advice import NODEMASK, advise, carries_copies

    def advice(library, copies=False, graph_share=0.0):
        st = Stat.from_samples([0.002] * 5)
        grow = Growth(stage="forward", batch_sizes=(32, 16), per_sample=st,
                      at_batch=Stat.from_samples([0.08] * 5), share=0.8, grows=True)
        site = CodeSite("dense_project_pool", "pool2_slow.py", 30, library, 9.0, 0.0, 0.8, 4,
                        graph_share)
        c = Cause("forward", "12 ms per step against 1 ms", 1.0, 0.1, 0.9, 0.9, "measured",
                  effect="adds", stage="forward", growth=grow, sites=[site])
        advise([c], "cpu", copies=copies)
        return c.advice
    dense = advice("Linear.forward (torch/nn/modules/linear.py:124)")
    assert NODEMASK not in dense and dense == ""
    conv = advice("SAGEConv.forward (torch_geometric/nn/conv/sage_conv.py:120)")
    assert NODEMASK in conv and "runs graph code (SAGEConv.forward" in conv
    # PyG's own GNN models and dense convs are graph code; its MLP and Linear are not (review)
    assert NODEMASK in advice("BasicGNN.forward (torch_geometric/nn/models/basic_gnn.py:230)")
    assert NODEMASK in advice("DenseSAGEConv.forward "
                              "(torch_geometric/nn/dense/dense_sage_conv.py:50)")
    assert advice("MLP.forward (torch_geometric/nn/models/mlp.py:200)") == ""
    assert advice("Linear.forward (torch_geometric/nn/dense/linear.py:140)") == ""
    # a user's own MessagePassing subclass: no one library holds most of its time, but its
    # propagate holds at least a quarter (the matrix's TorchCell-style case)
    assert "60% of its largest site's time" in advice("", graph_share=0.6)
    assert advice("", graph_share=0.1) == ""
    assert NODEMASK in advice("", copies=True) and "carries one graph copy per sample" in \
        advice("", copies=True)
    assert carries_copies("replicated_mask_cpu") and not carries_copies("node_mask_shared")
    assert not carries_copies("dango_wildtype") and not carries_copies("my_pipeline")


def test_a_backward_that_grows_in_graph_code_is_advised_when_the_forward_is_not():
    """Found by a user trial: masked copies of a SAGE encoder, declared with shared_encoder,
    whose backward held 75% of the gap (2.22 ms per extra sample, under SAGEConv) while the
    forward was too small a cause to advise: 'no change follows'. The backward's own figures
    now carry the shared-pass advice and the encoder's figures; a backward mirroring an
    advised forward keeps quoting the forward's; one that does not grow, or not in graph code,
    is not advised (both ways)."""
    from workbook_lib.results.verdict import Cause, CodeSite
    from workbook_lib.studies.verdict.advice import NODEMASK, advise

    st = Stat.from_samples([0.040, 0.041, 0.039]), Stat.from_samples([0.010, 0.011, 0.009])
    fig = EncoderFigures(batch_size=4, masked_copies=st[0], converted=st[1],
                         ratio=Stat.from_samples([4.0, 3.9, 4.1]), num_genes=40)

    def causes(bwd_grows=True, library="SAGEConv.forward (torch_geometric/nn/conv/sage_conv.py:"
               "120)", fwd_share=0.02, encoder=None, bwd_function="SageLN.forward",
               fwd_ops=None):
        def cause(stage, share, grows, function="SageLN.forward", ops=None):
            grow = Growth(stage=stage, batch_sizes=(4, 2), per_sample=Stat.from_samples(
                [0.00222] * 5), at_batch=Stat.from_samples([0.0097] * 5), share=0.92,
                grows=grows, ops_per_sample=ops)
            site = CodeSite(function, "models.py", 17, library, 9.0, 0.0, 0.99, 4)
            return Cause(stage, "9.66 ms per step against 3.07 ms", 1.0, 0.1, 0.9, share,
                         "measured", effect="adds", stage=stage, growth=grow, sites=[site])
        rows = [cause("backward", 0.75, bwd_grows, bwd_function),
                cause("forward", fwd_share, True, ops=fwd_ops)]
        advise(rows, "cpu", encoder=encoder)
        return rows[0].advice, rows[1].advice
    bwd, fwd = causes()
    assert bwd.startswith(NODEMASK) and fwd == ""
    assert "the backward costs 2.22 ms more for each extra sample" in bwd
    assert "runs graph code (SAGEConv.forward" in bwd
    bwd, _ = causes(encoder=fig)
    assert "your encoder converts: 40 -> 10 ms per batch of 4" in bwd
    assert "its encoder (shared_encoder) runs on a graph copy per sample" in bwd
    assert causes(bwd_grows=False)[0] == ""
    assert causes(library="Linear.forward (torch/nn/modules/linear.py:124)")[0] == ""
    # the forward advised too: the backward mirrors it, its figures quoted once
    bwd, fwd = causes(fwd_share=0.2, encoder=fig)
    assert fwd.startswith(NODEMASK) and bwd.startswith("the backward mirrors the forward")
    assert bwd.count("your encoder converts") == 1  # the forward's, quoted whole: the lead may
    # quote the backward's row alone
    # (a review) the forward advised and the backward's largest site another function: the
    # forward's advice stands for both, its figures said once
    bwd, fwd = causes(fwd_share=0.2, encoder=fig, bwd_function="Other.forward")
    assert NODEMASK in fwd and NODEMASK not in bwd
    assert (bwd + fwd).count("your encoder converts") == 1
    # a forward that loops over samples in graph code: the loop first, then the shared pass
    # with the encoder's figures
    _, fwd = causes(fwd_share=0.2, encoder=fig, fwd_ops=50.0)
    assert fwd.startswith("a Python loop over the samples") and NODEMASK in fwd
    assert "your encoder converts: 40 -> 10 ms" in fwd
