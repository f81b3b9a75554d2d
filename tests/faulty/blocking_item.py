"""Faulty: the dataset reads each sample from a network filesystem that stops answering after
the first few dozen reads (the read blocks, as a hard-mounted NFS does)."""
import time

import torch
from torch.utils.data import Dataset

from faulty_common import MyPipeline

ANSWERS = 40  # reads before the filesystem stops answering


class RemoteSamples(Dataset):
    def __init__(self, deleted, y):
        self.deleted, self.y, self.reads = deleted, y, 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        if self.reads > ANSWERS:
            time.sleep(3600)  # the read never returns
        return self.deleted[i], self.y[i]


class BlockingItem(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        self.samples = RemoteSamples(self.deleted, self.y)

    def dataset(self):
        return self.samples


def make_pipeline(params, graph, device):
    return BlockingItem(graph, device)
