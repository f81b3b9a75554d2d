"""First derivatives only, said at once: a decorator for an ``autograd.Function``'s backward
whose work does not build a graph (compiled kernels, writes into given buffers).

Why not ``torch.autograd.function.once_differentiable``: its mark is a node that raises only if
the engine runs it, and ``torch.autograd.grad(..., inputs=x)`` does not run it where ``x`` has
other paths; nor does it mark anything where the incoming gradient carries no graph (a loss
``out.sum()`` after the function) although the parameters' mixed terms still flow through it.
Either way the second derivative's terms through the backward were left out without a word
(found by ``tests/test_convert_second_order.py``: a converted GIN-MLP sum 54,000 off in
float64). An engine runs a backward with grad mode on exactly when it builds a graph
(``create_graph=True``), so :func:`first_order` raises there, naming the function.
"""
from __future__ import annotations

import functools

import torch

from .convert_trace import ConvertError


def first_order(what: str):
    """Decorate a backward that computes first derivatives only: under ``create_graph`` it raises
    :class:`~.convert_trace.ConvertError` (``what``: the work that cannot take a second
    derivative, for the message); otherwise it runs without building a graph.

    Args:
        what: e.g. ``"its fused GIN-MLP blocks"``.
    """
    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            refuse_second_order(ctx, what)
            return backward(ctx, *grads)
        return wrapper
    return decorate


def refuse_second_order(ctx, what: str) -> None:
    """:func:`first_order`'s check, for a backward of which only one path is first-order: raise
    under ``create_graph`` (see :func:`first_order`)."""
    if torch.is_grad_enabled():
        name = type(ctx).__name__.removesuffix("Backward")
        raise ConvertError(
            f"a second derivative (create_graph=True) through {name} is not supported: {what} "
            "compute first derivatives only; take second derivatives through the plain model "
            "(the encoder itself on each sample's graph)")
