"""Planted: a slow optimizer (a row-wise Adagrad written as a Python loop over blocks of rows)."""
import torch

from planted_common import MyPipeline


class RowAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-2, rows=4):
        super().__init__(params, {"lr": lr, "rows": rows})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros_like(p)
                if p.dim() < 2:
                    state["sum"].add_(p.grad * p.grad)
                    p.sub_(group["lr"] * p.grad / (state["sum"].sqrt() + 1e-10))
                    continue
                for r in range(0, p.shape[0], group["rows"]):  # block by block
                    g = p.grad[r:r + group["rows"]]
                    s = state["sum"][r:r + group["rows"]]
                    s.add_(g * g)
                    p[r:r + group["rows"]].sub_(group["lr"] * g / (s.sqrt() + 1e-10))


class SlowOptimizer(MyPipeline):
    def configure_optimizer(self, parameters):
        return RowAdagrad(parameters)


def make_pipeline(params, graph, device):
    return SlowOptimizer(graph, device)
