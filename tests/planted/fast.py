"""The fast side of every planted pair: the README's example as it is."""
from planted_common import MyPipeline


def make_pipeline(params, graph, device):
    return MyPipeline(graph, device)
