"""Example 3 (``examples/nodemask_pyg.py``) wrapped in a module of its own, as a user's rewrite
may be: the same computation, every parameter named ``net.<example 1's name>``. ``equal`` must
refuse to pair the parameters (naming both sides) unless told the renames
(``--map embedding=net.embedding --map lins=net.lins --map head=net.head``)."""
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import nodemask_pyg  # noqa: E402


class Wrapped(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, deleted, graph):
        return self.net(deleted, graph)


def make_pipeline(params, graph, device):
    pipe = nodemask_pyg.make_pipeline(params, graph, device)
    pipe.model = Wrapped(pipe.model).to(torch.device(device))
    return pipe
