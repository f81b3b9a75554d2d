"""Faulty: the forward raises on its 4th call (as a forward that meets a bad batch a few steps
in). RANK=r in the environment (a DDP rank) limits it to that rank; FAULTY_CALL sets the call."""
import os

from faulty_common import MyPipeline


class RaisesLater(MyPipeline):
    calls = 0

    def forward(self, model, batch):
        self.calls += 1
        only = os.environ.get("FAULTY_RANK")
        if self.calls == int(os.environ.get("FAULTY_CALL", "4")) and \
                (only is None or os.environ.get("RANK") == only):
            raise RuntimeError(f"index 9999 is out of bounds for dimension 0 (call {self.calls})")
        return super().forward(model, batch)


def make_pipeline(params, graph, device):
    return RaisesLater(graph, device)
