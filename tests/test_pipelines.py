"""The pipeline protocol: user pipelines named in params, the three PyG examples (example 3 equal
to example 1 in outputs and gradients), the Lightning adapter, and every bad pipeline refused
before any timing with one line naming it."""
import textwrap
from pathlib import Path

import pytest
import torch

from workbook_lib.exceptions import ParamsError, PipelineError
from workbook_lib.pipelines import build_pipeline, check_pipeline, parse_specs
from workbook_lib import cli
from workbook_lib.configs.loading import read_params_file
from workbook_lib.configs.validation import ddp_strategy, validate
from workbook_lib.training import loop

from conftest import make_graph

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {n: f"examples/{n}.py:make_pipeline" for n in ("lazy_pyg", "dango_pyg", "nodemask_pyg",
                                                           "torchcell_pyg", "torchcell_converted")}


def _params(**kw):
    _src, base = read_params_file(ROOT / "params" / "ci.yaml")
    base.update(pipelines=list(EXAMPLES.values()), **kw)
    return validate(base)


# ------------------------------------------------------------------ params
def test_spec_names_and_the_gap_default():
    specs = parse_specs(["examples/lazy_pyg.py:make_pipeline", "mine=examples/dango_pyg.py:make_pipeline",
                         "os.path:join"])
    assert [s.name for s in specs] == ["lazy_pyg", "mine", "path"]
    assert specs[0].is_file and not specs[2].is_file
    p = _params()
    assert p["gap_strategies"] == ["lazy_pyg", "dango_pyg"]  # the first two pipelines
    assert _params(gap_strategies=["dango_pyg", "lazy_pyg"])["gap_strategies"] == ["dango_pyg",
                                                                                   "lazy_pyg"]


@pytest.mark.parametrize("entry, words", [
    ("examples/nothere.py:make", "does not exist"),
    ("examples/lazy_pyg.py", "is not 'package.module:factory'"),
    ("examples/lazy_pyg.py:make-pipeline", "is not a Python name"),
    ("bad name=examples/lazy_pyg.py:make_pipeline", "must be an identifier"),
    ("node_mask_shared=examples/lazy_pyg.py:make_pipeline", "built-in strategies"),
])
def test_bad_specs_are_params_errors(entry, words):
    with pytest.raises(ParamsError, match="'pipelines'") as ei:
        validate({"pipelines": [entry]})
    assert words in str(ei.value)


def test_gap_and_ddp_names_must_be_compared():
    with pytest.raises(ParamsError, match="'gap_strategies'.*does not compare"):
        validate({"gap_strategies": ["lazy_pyg", "dango_wildtype"]})
    with pytest.raises(ParamsError, match="'ddp_strategy'"):
        validate({"ddp_strategy": "nope"})
    with pytest.raises(ParamsError, match="'ddp_strategy' must name a strategy or pipeline the "
                                          "run compares"):  # a built-in left out of the run
        validate({"strategies": [], "pipelines": list(EXAMPLES.values()),
                             "ddp_strategy": "node_mask_shared"})
    p = validate({"strategies": [], "pipelines": list(EXAMPLES.values())})
    assert p["ddp_strategy"] is None and ddp_strategy(p) == p["gap_strategies"][0]
    assert ddp_strategy(validate({})) == "node_mask_shared"
    with pytest.raises(ParamsError, match="'strategies' must not be empty"):
        validate({"strategies": []})
    assert validate({"strategies": [], "pipelines": list(EXAMPLES.values()),
                                "ddp_strategy": "nodemask_pyg"})["ddp_strategy"] == "nodemask_pyg"


def test_several_factories_of_one_file_are_named_by_their_factories():
    """A user's habit: one file, a factory per variant, no NAME=: each is named by its
    factory; a clash with an explicit name or a built-in strategy takes module.factory; the
    same entry twice is still refused."""
    f = "tests/matrix/family.py"
    p = validate({"strategies": [], "pipelines": [f"{f}:slow", f"{f}:fast"]})
    assert [s.name for s in parse_specs(p["pipelines"])] == ["slow", "fast"]
    assert p["gap_strategies"] == ["slow", "fast"]
    names = [s.name for s in parse_specs([f"{f}:slow", f"{f}:fast",
                                                     f"fast={f}:inexact"])]
    assert names == ["slow", "family.fast", "fast"]
    with pytest.raises(ParamsError, match="twice"):
        validate({"strategies": [], "pipelines": [f"{f}:slow", f"{f}:slow"]})


# ------------------------------------------------------------------ the examples
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_example_3_equals_example_1_in_outputs_and_gradients(layers):
    g = make_graph(num_genes=40, types={"a": 120, "b": 60, "c": 25}, seed=3)
    p = _params(hidden=8, layers=layers, perturbation_k=3, batch_size_lazy=5)
    lazy = build_pipeline(p, "lazy_pyg", g, "cpu")
    fix = build_pipeline(p, "nodemask_pyg", g, "cpu")
    outs, grads = [], []
    for pipe in (lazy, fix):
        items = [pipe.dataset()[i] for i in range(5)]
        batch = pipe.to_device(pipe.collate(items))
        out = pipe.forward(pipe.model, pipe.prepare(batch))
        pipe.loss(out, batch).backward()
        outs.append(out.detach())
        grads.append({k: v.grad for k, v in pipe.model.named_parameters()})
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-6)
    assert set(grads[0]) == set(grads[1]) and len(grads[0]) == 2 * layers + 3
    for k in grads[0]:
        scale = grads[0][k].abs().max().item()
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6 + 1e-4 * scale), k
    # the labels are learnable and the two pipelines serve the same samples
    assert torch.equal(lazy.deleted, fix.deleted) and torch.equal(lazy.y, fix.y)


@pytest.mark.parametrize("layers", [1, 3])
def test_the_converted_torchcell_equals_its_masked_copies(layers):
    """Example 5 (convert) against example 4 (B masked copies): outputs and every gradient, and
    both name their encoder, input, graph and deleted genes (shared_encoder)."""
    g = make_graph(num_genes=40, types={"a": 120, "b": 60, "c": 25}, seed=3)
    p = _params(hidden=8, layers=layers, perturbation_k=3, batch_size_lazy=5)
    copies = build_pipeline(p, "torchcell_pyg", g, "cpu")
    fast = build_pipeline(p, "torchcell_converted", g, "cpu")
    outs, grads, shared = [], [], []
    for pipe in (copies, fast):
        batch = pipe.to_device(pipe.collate([pipe.dataset()[i] for i in range(5)]))
        out = pipe.forward(pipe.model, pipe.prepare(batch))
        pipe.loss(out, batch).backward()
        outs.append(out.detach())
        grads.append({k: v.grad for k, v in pipe.model.named_parameters()})
        shared.append(pipe.shared_encoder(batch))
    assert torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-6)
    assert set(grads[0]) == set(grads[1])
    for k in grads[0]:
        scale = grads[0][k].abs().max().item()
        assert torch.allclose(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6 + 1e-4 * scale), k
    assert torch.equal(shared[0][3], shared[1][3]) and type(shared[0][0]).__name__ == type(shared[1][0]).__name__


def test_examples_through_the_loop_in_every_mode():
    g = make_graph(num_genes=30, types={"a": 80, "b": 40}, seed=2)
    p = _params(hidden=4, batch_size_lazy=4, batch_size_dango=6)
    arms = []
    for name in EXAMPLES:
        pipe = build_pipeline(p, name, g, "cpu")
        opt = pipe.configure_optimizer(pipe.model.parameters())
        ld = loop.make_loader(pipe)
        arms += [loop.Arm(f"{name}/{m}", pipe, ld, loop.Variant(m, m), optimizer=opt)
                 for m in loop.MODES]
    res = loop.run_arms(arms, warmup_steps=1, min_steps=2, max_steps=2, budget_s=30)
    assert res["dango_pyg/full"].batch_size == 6 and res["lazy_pyg/full"].batch_size == 4
    for name in EXAMPLES:
        assert "forward" not in res[f"{name}/data"].stages  # the empty task
        assert "optimizer" in res[f"{name}/full"].stages
    assert res["dango_pyg/data"].syncs_per_step is not None


# ------------------------------------------------------------------ Lightning
def _lightning_pipeline():
    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    from workbook_lib.pipelines.lightning import LightningPipeline

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                           torch.nn.Linear(16, 1))
            self.seen = {"before": 0, "after": 0}

        def on_before_batch_transfer(self, batch, idx):
            self.seen["before"] += 1
            return batch

        def on_after_batch_transfer(self, batch, idx):
            self.seen["after"] += 1
            return batch

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
            self.log("train_loss", loss)
            return {"loss": loss}

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.05)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 10)}

    class Data(L.LightningDataModule):
        def setup(self, stage):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(96, 8, generator=g)
            self.y = self.x.sum(dim=1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(self.x, self.y), batch_size=8)
    return LightningPipeline(Regressor(), Data(), "cpu")


def test_lightning_module_profiled_in_four_modes():
    pipe = _lightning_pipeline()
    check_pipeline(pipe)
    assert pipe.name == "Regressor" and pipe.batch_size == 8
    opt = pipe.configure_optimizer(None)
    assert isinstance(opt, torch.optim.SGD)
    ld = loop.make_loader(pipe)
    arms = [loop.Arm(f"lit/{m}", pipe, ld, loop.Variant(m, m), optimizer=opt) for m in loop.MODES]
    arms[-1].record_losses = True
    calls = pipe._step_index
    res = loop.run_arms(arms, warmup_steps=1, min_steps=3, max_steps=3, budget_s=30)
    assert "forward" not in res["lit/data"].stages and "optimizer" in res["lit/full"].stages
    # training_step ran for every step of the three model modes (warm-up, counted and timed
    # steps), never in the data-only mode; the transfer hooks ran in every mode
    assert pipe._step_index - calls == 3 * (1 + 1 + 3)
    assert pipe.module.seen["before"] == pipe.module.seen["after"] >= 4 * 5
    losses = [float(x) for x in arms[-1].losses]
    assert len(losses) == 1 + 1 + 3 and all(x == x for x in losses)  # warm-up, counted, timed


# ------------------------------------------------------------------ bad pipelines
BAD = {
    "does_not_import": ("import no_such_module_anywhere\n", "does not import"),
    "factory_raises": ("def make(params, graph, device):\n    raise RuntimeError('boom')\n",
                       "raised RuntimeError: boom"),
    "no_factory": ("x = 1\n", "has no 'make'"),
    "missing_method": ("""
        import torch
        class P:
            model = torch.nn.Linear(2, 1)
            batch_size = 2
            def dataset(self): return [torch.zeros(2)] * 4
            def collate(self, items): return torch.stack(items)
            def to_device(self, b, non_blocking=False): return b
            def prepare(self, b): return b
            def forward(self, model, x): return model(x)
        def make(params, graph, device): return P()
        """, "without loss"),
    "duck_typed": ("""
        import torch
        class P:
            model = torch.nn.Linear(2, 1)
            batch_size = 2
            def dataset(self): return [torch.zeros(2)] * 4
            def collate(self, items): return torch.stack(items)
            def forward(self, model, x): return model(x)
            def loss(self, out, b): return out.sum()
        def make(params, graph, device): return P()
        """, "without to_device, prepare (see workbook_lib.pipelines.Pipeline; subclass it for "
             "the defaults of to_device, prepare)"),
    "no_forward": ("""
        import torch
        from workbook_lib.pipelines import Pipeline
        class P(Pipeline):
            def __init__(self):
                self.model, self.batch_size, self.device = torch.nn.Linear(2, 1), 4, 'cpu'
            def dataset(self): return [torch.zeros(2)] * 8
            def collate(self, items): return torch.stack(items)
            def loss(self, out, b): return out.sum()
        def make(params, graph, device): return P()
        """, "P does not define forward (Pipeline has no default for it)"),
    "instance_forward": ("""
        import torch
        from workbook_lib.pipelines import Pipeline
        class P(Pipeline):
            def __init__(self):
                self.model, self.batch_size, self.device = torch.nn.Linear(2, 1), 4, 'cpu'
                self.forward = lambda model, x: model(x)  # its own, set on the instance
            def dataset(self): return [torch.zeros(2)] * 8
            def collate(self, items): return torch.stack(items)
            def loss(self, out, b): return out ** 2
        def make(params, graph, device): return P()
        """, "loss must be a scalar tensor"),  # past the stage check: its forward is its own
    "wrong_shape": ("""
        import torch
        from workbook_lib.pipelines import Pipeline
        class P(Pipeline):
            def __init__(self):
                self.model, self.batch_size, self.device = torch.nn.Linear(2, 1), 4, 'cpu'
            def dataset(self): return [torch.zeros(2)] * 8
            def collate(self, items): return torch.stack(items)
            def forward(self, model, x): return model(x).reshape(-1)[:2]
            def loss(self, out, b): return out.sum()
        def make(params, graph, device): return P()
        """, "forward returned 2 rows for a batch of 4"),
    "loss_not_scalar": ("""
        import torch
        from workbook_lib.pipelines import Pipeline
        class P(Pipeline):
            def __init__(self):
                self.model, self.batch_size, self.device = torch.nn.Linear(2, 1), 4, 'cpu'
            def dataset(self): return [torch.zeros(2)] * 8
            def collate(self, items): return torch.stack(items)
            def forward(self, model, x): return model(x)
            def loss(self, out, b): return out ** 2
        def make(params, graph, device): return P()
        """, "loss must be a scalar tensor (got a tensor of shape [4, 1])"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pipeline_refused_before_any_work(case, tmp_path, capsys):
    code, words = BAD[case]
    f = tmp_path / f"{case}.py"
    f.write_text(textwrap.dedent(code))
    out = tmp_path / "run"
    rc = cli.main(["run", "--params", str(ROOT / "params" / "ci.yaml"), "--out", str(out),
                   "--set", f"pipelines=['{f}:make']", "--set", "strategies=[node_mask_shared]",
                   "--set", "gap_strategies=[node_mask_shared, " + case + "]", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and f"pipeline '{case}'" in err[0] and words in err[0], err
    assert "Traceback" not in err[0]
    assert not out.exists()  # refused before the run folder was made


def test_check_pipeline_names_the_stage():
    class NoGrad:
        name, batch_size, device = "frozen", 2, torch.device("cpu")
        model = torch.nn.Linear(2, 1).requires_grad_(False)

        def dataset(self):
            return [torch.zeros(2)] * 2

        def collate(self, items):
            return torch.stack(items)

        def to_device(self, b, non_blocking=False):
            return b

        def prepare(self, b):
            return b

        def forward(self, model, x):
            return model(x)

        def loss(self, out, b):
            return out.sum()
    with pytest.raises(PipelineError, match="pipeline 'frozen': the loss does not require grad"):
        check_pipeline(NoGrad())


def test_readme_example_works_pasted_into_a_new_file(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = text.split("<!-- pipeline-example -->\n```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_pipeline.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # "anywhere": found relative to the current folder
    _src, raw = read_params_file(ROOT / "params" / "ci.yaml")
    p = validate({**raw, "pipelines": ["my_pipeline.py:make_pipeline"]})
    assert p["pipelines"] == [f"my_pipeline={tmp_path / 'my_pipeline.py'}:make_pipeline"]
    g = make_graph(num_genes=30, types={"a": 80, "b": 40}, seed=2)
    pipe = build_pipeline(p, "my_pipeline", g, "cpu")  # checked on one batch
    opt = pipe.configure_optimizer(pipe.model.parameters())
    arm = loop.Arm("mine", pipe, loop.make_loader(pipe), loop.Variant("full"), optimizer=opt)
    res = loop.run_arms([arm], warmup_steps=1, min_steps=2, max_steps=2)
    assert res["mine"].timed_steps == 2 and res["mine"].batch_size == p["batch_size_lazy"]


def test_shared_pass_timed_where_a_pipeline_has_one():
    from workbook_lib.studies.timing import shared_pass_times

    g = make_graph(num_genes=30, types={"a": 80, "b": 40}, seed=2)
    p = _params(hidden=4)
    made = {n: build_pipeline(p, n, g, "cpu") for n in ("lazy_pyg", "dango_pyg", "nodemask_pyg",
                                                         "node_mask_shared", "dango_wildtype")}
    # the two examples' wildtype passes are the same computation
    a, b = (made[n].shared_forward(made[n].model) for n in ("lazy_pyg", "nodemask_pyg"))
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    times = shared_pass_times(made, p.measure, torch.device("cpu"))
    assert set(times) == {"lazy_pyg", "nodemask_pyg", "node_mask_shared"}  # dual forward only
    assert all(t.n >= p["min_repeats"] for t in times.values())
