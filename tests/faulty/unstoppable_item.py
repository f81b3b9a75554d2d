"""Faulty: like blocking_item.py, but the blocked read cannot be interrupted (as a process in
uninterruptible I/O on a hard-mounted NFS: simulated by blocking SIGALRM around the read)."""
import signal
import time

from torch.utils.data import Dataset

from faulty_common import MyPipeline

ANSWERS = 40


class StuckSamples(Dataset):
    def __init__(self, deleted, y):
        self.deleted, self.y, self.reads = deleted, y, 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        if self.reads > ANSWERS:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        return self.deleted[i], self.y[i]


class UnstoppableItem(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        self.samples = StuckSamples(self.deleted, self.y)

    def dataset(self):
        return self.samples


def make_pipeline(params, graph, device):
    return UnstoppableItem(graph, device)
