"""Planted: a slow loss, vectorized: a soft ranking of the batch's predictions against its
labels by Sinkhorn iterations (many small operations per step, the same number whatever the
batch size)."""
import torch

from planted_common import MyPipeline


def soft_rank_loss(pred, target, iterations=300, tau=0.1):
    """How far the soft ranks of the predictions are from the labels' ranks."""
    b = pred.shape[0]
    slots = torch.arange(b, dtype=pred.dtype, device=pred.device)
    cost = (pred[:, None] - slots[None, :] / b) ** 2
    log_p = -cost / tau
    for _ in range(iterations):  # Sinkhorn: rows, then columns, normalized in log space
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
    soft = (log_p.exp() * slots[None, :]).sum(dim=1)
    hard = target.argsort().argsort().to(pred.dtype)
    return ((soft - hard) ** 2).mean() / b


class SlowLoss(MyPipeline):
    def loss(self, output, batch):
        return soft_rank_loss(output, batch[1])


def make_pipeline(params, graph, device):
    return SlowLoss(graph, device)
