"""Faulty: the forward reaches into the model it is given (model.conv, model.head) instead of
calling it. It trains on one process; DDP's wrapper has no 'conv'."""
from faulty_common import MyPipeline


class CallsSubmodule(MyPipeline):
    def forward(self, model, batch):
        deleted = batch[0]
        x = model.conv(model.embedding, self.edge_index).relu()
        return model.head(x[deleted].mean(dim=1)).squeeze(-1)


def make_pipeline(params, graph, device):
    return CallsSubmodule(graph, device)
