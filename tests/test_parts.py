"""Where a converted step's time goes (nodemask.parts, results.parts): each part's own time (less
the parts inside it), a backward booked to the part whose forward made it, the device
synchronized around each part on a GPU (driven here with a stand-in), the step unchanged by the
timing (bit for bit), and each part beside the floor parts it covers. The clock is a stand-in
wherever a figure is asserted: no test depends on this machine's speed."""
import pytest
import torch

from workbook_lib.nodemask import convert
from workbook_lib.nodemask import parts
from workbook_lib.results.floor import ConvertFloor, FloorPart
from workbook_lib.results.parts import PartTime, StepParts, covers

from conftest import make_graph


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(parts.time, "perf_counter", c)
    return c


def test_a_part_is_booked_its_own_time_less_the_parts_inside_it(clock):
    with parts.collect() as c:
        with parts.timed("layer"):
            clock.now += 2.0
            with parts.timed(parts.WILDTYPE):
                clock.now += 3.0
            clock.now += 1.0
        parts.switch("node a")
        clock.now += 4.0
        parts.switch("node b")
        clock.now += 0.5
        parts.switch(None)
    assert c.times == {("layer", "forward"): 3.0, (parts.WILDTYPE, "forward"): 3.0,
                   ("node a", "forward"): 4.0, ("node b", "forward"): 0.5}


@parts.timed_function
class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        Clock.shared.now += 7.0
        return 2 * g


def test_a_backward_is_booked_to_the_part_whose_forward_made_it(clock):
    Clock.shared = clock
    x = torch.ones(3, requires_grad=True)
    with parts.collect() as c:
        with parts.timed("convs.1.*"):
            y = _Double.apply(x)
        clock.now += 1.0
        y.sum().backward()
    got = c.times
    assert got[("convs.1.*", "backward")] == 7.0 and got[("convs.1.*", "forward")] == 0.0
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_outside_collect_nothing_is_timed_or_noted(clock):
    Clock.shared = clock
    x = torch.ones(2, requires_grad=True)
    with parts.timed("a"):
        y = _Double.apply(x)
    assert not parts.active() and parts.current() == "unlabelled"
    assert not hasattr(y.grad_fn, "wb_part")
    y.sum().backward()  # no collector: runs as it is
    with parts.collect():
        with pytest.raises(ValueError, match="not reentrant"):
            with parts.collect():
                pass
    assert not parts.active()


@pytest.mark.parametrize("bad, match", [({"steps": 0}, "'steps' must be at least 1"),
                                        ({"warmup": -1}, "'warmup' must be 0 or more")])
def test_time_parts_refuses_bad_counts(bad, match):
    with pytest.raises(ValueError, match=match):
        parts.time_parts(lambda: None, **bad)


def test_a_gpu_is_synchronized_around_each_part(monkeypatch, clock):
    """The CUDA path (a stand-in synchronize: the same code with a CUDA device): the step is
    synchronized before and after, and each part's start and end."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))

    def step():
        with parts.timed("a"):
            clock.now += 1.0
    got = parts.time_parts(step, steps=2, device="cuda", warmup=0)
    assert got.synchronized and got.parts["a"].forward_s == 1.0 and got.step_s == 1.0
    assert len(calls) == 2 + 2 * 2  # the step's two ends, each part's two, per step
    assert all(d == torch.device("cuda") for d in calls)
    cpu = parts.time_parts(step, steps=1, device="cpu", warmup=0)
    assert not cpu.synchronized and len(calls) == 6


def _floor(**named) -> ConvertFloor:
    return ConvertFloor(batch_size=2, num_nodes=10,
                        parts={k.replace("__", "."): FloorPart(s, d, 0.0)
                               for k, (s, d) in named.items()})


def test_each_floor_part_is_booked_to_the_longest_label_it_falls_under():
    step = StepParts(step_s=10.0, steps=1, parts={
        "convs.1.*": PartTime(2.0, 3.0), "convs.1.a": PartTime(1.0, 0.0),
        "plan (host)": PartTime(2.0, 0.0), "relu_1": PartTime(0.01, 0.0),
        "wildtype, once per batch": PartTime(0.5, 0.5)})
    floor = _floor(convs__1__a=(1e9, 0.0), convs__1__b=(0.0, 2e9), convs__2=(1e9, 0.0),
                   **{"wildtype, once per batch": (0.0, 2e9)})
    rows = {r.label: r for r in step.against(floor, sparse_gmacs=1.0, dense_gmacs=2.0)}
    assert rows["convs.1.*"].floor_parts == ["convs.1.b"]  # not convs.1.a: its own label's
    assert rows["convs.1.*"].floor_s == pytest.approx(1.0) and rows["convs.1.*"].ratio == 5.0
    assert rows["convs.1.a"].floor_parts == ["convs.1.a"] and rows["convs.1.a"].ratio == 1.0
    assert rows["convs.2"].measured_s == 0.0 and rows["convs.2"].floor_s == 1.0  # timed nowhere
    assert rows["plan (host)"].floor_s is None and rows["plan (host)"].ratio is None
    assert rows["wildtype, once per batch"].floor_s == 1.0
    assert "relu_1" not in rows and rows["other parts (1, each under 0.5% of the step)"]
    rest = [r for r in rows.values() if r.label.startswith("rest")]
    assert rest[0].measured_s == pytest.approx(10.0 - 9.01)
    with pytest.raises(ValueError, match="rates must be positive"):
        step.against(floor, 0.0, 1.0)


@pytest.mark.parametrize("label, name, under", [
    ("convs.1.*", "convs.1.physical", True), ("convs.1.*", "convs.10.a", False),
    ("convs.1", "convs.1[gene__a__gene]", True), ("convs.1", "convs.1.lin", True),
    ("convs.1", "convs.10", False), ("convs.1.a", "convs.1.a", True),
    ("convs.1.a", "convs.1.a'", True)])  # a module's second call, as the floor names it
def test_covers(label, name, under):
    assert covers(label, name) is under


def _encoder():
    from workbook_lib.studies.mask_cost.convert_bench import TorchCellModel

    g = make_graph(num_genes=30, types={"a": 80, "b": 40, "c": 20}, seed=5)
    edges = dict(g.edge_index)
    m = TorchCellModel(30, list(edges), 8, 3, seed=0).double()
    return m, convert(m.encoder, edges, readout=m.pool)


def test_a_converted_step_timed_by_part_is_the_same_step():
    """The TorchCell-shaped encoder: its parts are its fused sums, the plan, the wildtype and the
    readout; every floor part is under one of them; outputs and gradients bit for bit those of
    an untimed step."""
    m, fast = _encoder()
    x = torch.randn(30, 8, dtype=torch.float64)
    d = torch.tensor([[0, 3, -1], [5, 6, 7], [-1, -1, -1], [29, 1, -1]])

    def step():
        m.zero_grad(set_to_none=True)
        out = fast(x, d)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]
    fast.clear_plan()
    plain = step()
    fast.clear_plan()
    with parts.collect() as c:
        timed = step()
    got = c.times
    torch.testing.assert_close(timed, plain, rtol=0, atol=0)
    labels = {lb for lb, _ in got}
    assert {parts.PLAN, parts.WILDTYPE, "readout"} <= labels
    assert any(lb.endswith("*") for lb in labels)  # a fused sum's
    assert any(ph == "backward" and t > 0 for (lb, ph), t in got.items() if lb.endswith("*"))

    result = parts.time_parts(lambda: (fast.clear_plan(), step()), steps=2, warmup=0)
    floor = fast.floor(d)
    rows = result.against(floor, 1.0, 1.0, min_share=0.0)
    booked = [n for r in rows for n in r.floor_parts if r.measured_s > 0]
    assert sorted(booked) == sorted(floor.parts)  # every floor part under a timed part
    assert sum(r.floor_s or 0 for r in rows) == pytest.approx(
        floor.seconds_at(1.0, 1.0) * floor.batch_size)
    assert result.rest_s == pytest.approx(result.step_s - sum(
        p.total_s for p in result.parts.values()))


class _PooledTail(torch.nn.Module):
    """A GCN, then a GraphConv and a Linear: before a "mean" readout the affine tail is pooled
    (its rows never computed), so its modules' work is the readout's."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GCNConv, GraphConv

        self.c1, self.c2, self.lin = GCNConv(8, 8), GraphConv(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x, edge_index):
        return self.lin(self.c2(self.c1(x, edge_index).relu(), edge_index))


def test_a_pooled_tails_floor_is_booked_to_the_readout():
    g = make_graph(num_genes=30, types={"a": 80}, seed=5)
    enc = _PooledTail().double()
    fast = convert(enc, g.edge_index["a"], readout="mean")
    x = torch.randn(30, 8, dtype=torch.float64)
    d = torch.tensor([[0, 3], [5, -1]])

    def step():
        fast.clear_plan()
        fast(x, d).sum().backward()
    got = parts.time_parts(step, steps=1, warmup=1)
    floor = fast.floor(d)
    assert set(got.covers["readout"]) >= {"c2", "lin"}
    rows = got.against(floor, 1.0, 1.0, min_share=0.0)
    holder = {n: r.label for r in rows for n in r.floor_parts}
    assert holder["lin"] == "readout" and holder["c2"] == "readout", holder
    assert holder["c1"] == "c1"


def test_a_plan_made_ahead_is_booked_as_the_wait_for_it():
    m, fast = _encoder()
    x = torch.randn(30, 8, dtype=torch.float64)
    d = torch.tensor([[0, 3, -1], [5, 6, 7]])
    fast(x, d).sum().backward()
    fast.clear_plan()
    fast.plan_ahead(d, 30)
    with parts.collect() as c:
        fast(x, d).sum().backward()
    labels = {lb for lb, _ in c.times}
    assert parts.PLAN_WAITED in labels and parts.PLAN not in labels
