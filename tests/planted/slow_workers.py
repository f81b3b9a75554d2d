"""Planted: DataLoader workers that cannot keep up (run with num_workers: 1): each item's
hop-distance feature costs more than the one worker can hide behind the model."""
from slow_item import SlowItem


def make_pipeline(params, graph, device):
    return SlowItem(graph, device)
