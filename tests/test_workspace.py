"""nodemask.workspace: a converted encoder's large CPU buffers are kept and reused between
steps, never while anything still holds them."""
import torch
from torch_geometric.nn import GINConv

from workbook_lib.nodemask import convert
from workbook_lib.nodemask.workspace import PER_SITE, Workspace, take

from test_convert import DELETED, F_IN, GRAPH, N, GinMlpSums, _reference

convert_module = __import__("sys").modules["workbook_lib.nodemask.convert"]


def test_a_free_storage_is_handed_out_again_and_a_held_one_is_not():
    ws = Workspace(min_bytes=0)
    like = torch.zeros(1)
    a = ws.empty("s", (4, 3), like)
    assert a._base is None and a.is_contiguous() and a.shape == (4, 3)
    ptr = a.data_ptr()
    view = a[1:]
    del a
    b = ws.empty("s", (2, 3), like)  # the view still holds the first storage
    assert b.data_ptr() != ptr and ws.made == 2
    del view, b
    c = ws.empty("s", (3, 4), like)
    assert c.data_ptr() == ptr and ws.reused == 1
    del c
    d = ws.empty("s", (5, 5), like)  # larger than the free storage: it is replaced
    assert d.shape == (5, 5) and ws.made == 3 and d.untyped_storage().nbytes() >= 25 * 4
    held = [d] + [ws.empty("s", (1,), like) for _ in range(PER_SITE)]
    slots = ws._slots[("s", torch.float32)]  # the second storage reused, two more made
    assert len(slots) == PER_SITE and ws.made == 5 and ws.reused == 2
    ptrs = {t.data_ptr() for t in held}  # all taken: the last request got a plain tensor
    assert len(ptrs) == PER_SITE + 1 and {s[0].data_ptr() for s in slots} < ptrs
    other = ws.empty("t", (2,), torch.zeros(1, dtype=torch.float64))
    assert other.dtype == torch.float64 and ("t", torch.float64) in ws._slots
    ws.clear()
    assert ws.nbytes == 0 and torch.equal(held[0].zero_(), torch.zeros(5, 5))


def test_small_requests_and_other_devices_get_plain_tensors():
    ws = Workspace(min_bytes=1 << 20)
    assert ws.empty("s", (10,), torch.zeros(1)).shape == (10,) and not ws._slots
    meta = torch.zeros(1, device="meta")  # a GPU's caching allocator does the work there
    big = Workspace(min_bytes=0).empty("s", (1 << 20,), meta)
    assert big.device.type == "meta"
    assert take(None, "x", (2, 2), torch.zeros(1)).shape == (2, 2)


def test_without_the_use_count_every_request_is_a_plain_tensor(monkeypatch):
    import workbook_lib.nodemask.workspace as ws_module
    monkeypatch.setattr(ws_module, "_use_count", None)
    ws = Workspace(min_bytes=0)
    a = ws.empty("s", (3,), torch.zeros(1))
    assert a.shape == (3,) and not ws._slots and ws.made == 0


def _fused(monkeypatch):
    monkeypatch.setattr(convert_module, "DENSE_SHARE", 0.0)  # the dense sum: its big buffers
    torch.manual_seed(0)
    enc = GinMlpSums("relu").double()
    fast = convert(enc, GRAPH, readout="mean_kept")
    fast.workspace = Workspace(min_bytes=0)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    return enc, fast, x


def test_a_second_step_reuses_the_first_steps_storages(monkeypatch):
    enc, fast, x = _fused(monkeypatch)
    fast(x, DELETED).sum().backward()
    made, size = fast.workspace.made, fast.workspace.nbytes
    assert made > 0 and fast.workspace.reused == 0
    fast(x, DELETED).sum().backward()
    assert fast.workspace.made == made and fast.workspace.reused == made
    assert fast.workspace.nbytes == size


def test_a_retained_graph_keeps_its_buffers_through_another_forward(monkeypatch):
    """Two forwards before the first's second backward (retain_graph): each graph's saved
    buffers are its own, so both backwards give the reference's gradients."""
    enc, fast, x = _fused(monkeypatch)
    ref = _reference(enc, x, GRAPH, DELETED, "mean_kept")
    w = torch.randn_like(ref)  # (a plain sum of a LayerNorm's output has no gradient before it)
    params = list(enc.parameters()) + [x]
    want = torch.autograd.grad((ref * w).sum(), params)
    out1 = fast(x, DELETED)
    torch.autograd.grad((out1 * w).sum(), params, retain_graph=True)
    other = torch.tensor([[3, 9], [12, -1], [20, 21], [1, -1], [30, 2]])
    out2 = fast(x, other)  # a forward while the first graph is retained
    got1 = torch.autograd.grad((out1 * w).sum(), params)
    for a, b in zip(got1, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    want2 = torch.autograd.grad((_reference(enc, x, GRAPH, other, "mean_kept") * w).sum(),
                                params)
    got2 = torch.autograd.grad((out2 * w).sum(), params)
    for a, b in zip(got2, want2):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


class LastSum(torch.nn.Module):
    """A linear map, then per edge type a GIN-MLP, the types summed: the encoder's output."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.lin = nn.Linear(F_IN, 6)
        self.convs = nn.ModuleDict({"__".join(et): GINConv(nn.Sequential(
            nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6)), train_eps=True) for et in GRAPH})

    def forward(self, x, edges):
        x = self.lin(x).relu()
        return sum(self.convs["__".join(et)](x, ei) for et, ei in edges.items())


def test_an_output_the_caller_holds_is_not_written_by_the_next_step(monkeypatch):
    """With no readout the output is ``[B, N, H]`` from the workspace: held by the caller, the
    next step (other deletions) writes elsewhere."""
    monkeypatch.setattr(convert_module, "DENSE_SHARE", 0.0)
    torch.manual_seed(0)
    fast = convert(LastSum().double(), GRAPH)  # its output: the fused sum's buffer itself
    fast.workspace = Workspace(min_bytes=0)
    x = torch.randn(N, F_IN, dtype=torch.float64)
    first = fast(x, DELETED)
    held = first.clone()
    second = fast(x, torch.tensor([[3, 9], [12, -1], [20, 21], [1, -1], [30, 2]]))
    assert not torch.equal(second, held) and torch.equal(first, held)
    del first, second
    made = fast.workspace.made
    fast(x, DELETED)
    assert fast.workspace.made == made  # once let go, the storages are used again


def test_a_copy_gets_a_workspace_of_its_own(monkeypatch):
    import copy
    enc, fast, x = _fused(monkeypatch)
    fast(x, DELETED).sum().backward()
    twin = copy.deepcopy(fast)
    assert twin.workspace is not fast.workspace and twin.workspace.nbytes == 0
    assert twin.workspace.min_bytes == 0


def test_a_storage_moved_to_shared_memory_is_never_handed_out_again():
    """A tensor sent to another process has its storage moved to shared memory, and the sender
    holds it only weakly: once the caller drops it, the receiver may still be reading."""
    ws = Workspace(min_bytes=0)
    like = torch.zeros(1)
    a = ws.empty("s", (8,), like)
    ptr = a.data_ptr()
    a.share_memory_()  # what a torch.multiprocessing queue does to a tensor it sends
    del a
    b = ws.empty("s", (8,), like)
    assert b.data_ptr() != ptr and ws.reused == 0 and ws.made == 2
    del b
    c = ws.empty("s", (8,), like)  # the new storage is an ordinary one: reused
    assert ws.reused == 1 and not c.untyped_storage().is_shared()


def test_two_threads_never_get_the_same_storage(monkeypatch):
    """The free check and the hand-out are one step: two threads asking one site at once (two
    backwards in two threads) get two storages, even when each pauses between the two."""
    import threading
    import time

    import workbook_lib.nodemask.workspace as ws_module
    ws = Workspace(min_bytes=0)
    like = torch.zeros(1)
    del_me = ws.empty("s", (4,), like)  # one storage, free once this goes
    del del_me
    real = ws_module._users

    def slow(t):  # the other thread runs here, between the check and the hand-out
        n = real(t)
        time.sleep(0.02)
        return n
    monkeypatch.setattr(ws_module, "_users", slow)
    start = threading.Barrier(2)
    got = []

    def ask():
        start.wait()
        got.append(ws.empty("s", (4,), like))
    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({t.data_ptr() for t in got}) == 2


def second_order_matches_reference(seed: int = 0) -> torch.Tensor:
    """A GCN encoder with a linear map between its layers and no readout (its output every
    row), converted, its buffers from a workspace: the second-order gradient at ``x`` through
    create_graph=True equals the per-sample reference's (float64). Returns ``x``."""
    from test_convert import GRAPH as G, TYPES, Encoder
    torch.manual_seed(seed)
    enc = Encoder("gcn", "single", "linear").double()
    graph = G[TYPES[0]]
    fast = convert(enc, graph)
    fast.workspace = Workspace(min_bytes=0)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    from test_convert_second_order import _second
    _, got = _second(fast, x, graph, None, True)
    _, want = _second(enc, x, graph, None, False)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    return x


def test_a_backward_that_builds_a_graph_still_runs():
    """create_graph=True through the full value's backward: the second-order gradient equals
    the per-sample reference's."""
    second_order_matches_reference()
