"""How the slow model's parameters pair with the fast model's: by name, with an explicit
``OLD=NEW`` rename per parameter or module prefix (see :mod:`.equality`), and copied across."""
from __future__ import annotations

import torch

from ...exceptions import WorkbookError


class ParameterMismatchError(WorkbookError, ValueError):
    """The two models' parameters cannot be paired by name (a bad input: nothing was run).

    Attributes:
        missing: slow-model parameters the fast model lacks (after renames).
        extra: fast-model parameters no slow-model parameter maps to.
        shapes: ``{slow name: (slow shape, fast name, fast shape)}`` where they differ.
    """

    def __init__(self, message: str, *, missing=(), extra=(), shapes=None):
        super().__init__(message)
        self.missing, self.extra, self.shapes = list(missing), list(extra), dict(shapes or {})


# ------------------------------------------------------------------ parameter names
def _renamed(name: str, renames: dict[str, str]) -> str:
    """``name`` under the longest matching rename (a whole name or a module prefix)."""
    best = ""
    for old in renames:
        if (name == old or name.startswith(old + ".")) and len(old) > len(best):
            best = old
    return renames[best] + name[len(best):] if best else name


def parameter_mapping(slow: torch.nn.Module, fast: torch.nn.Module,
                      renames: dict[str, str] | None = None, *, slow_label: str = "slow",
                      fast_label: str = "fast") -> dict[str, str]:
    """``{slow parameter name: fast parameter name}`` covering both models' parameters.

    Args:
        slow, fast: the reference model and the rewrite; slow_label, fast_label: their names.
        renames: ``{slow name or prefix: fast name or prefix}`` (default: names must match).

    Raises:
        ParameterMismatchError: a parameter unpaired, a shape that differs, or an unused rename.
    """
    renames = renames or {}
    sp, fp = dict(slow.named_parameters()), dict(fast.named_parameters())
    unused = [o for o in renames if not any(n == o or n.startswith(o + ".") for n in sp)]
    if unused:
        raise ParameterMismatchError(
            f"--map {', '.join(unused)}: no parameter of '{slow_label}' has that name or prefix "
            f"(its parameters: {_names(sp)})")
    mapping = {n: _renamed(n, renames) for n in sp}
    missing = [n for n, m in mapping.items() if m not in fp]
    extra = sorted(set(fp) - set(mapping.values()))
    shapes = {n: (_shape(sp[n]), m, _shape(fp[m])) for n, m in mapping.items()
              if m in fp and (sp[n].shape != fp[m].shape or sp[n].layout != fp[m].layout)}
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"only '{slow_label}' has " + _names(
                [n if mapping[n] == n else f"{mapping[n]} (renamed from {n})" for n in missing]))
        if extra:
            parts.append(f"only '{fast_label}' has {_names(extra)}")
        if shapes:
            parts.append("shapes differ: " + ", ".join(
                f"{n} {a} vs {m} {b}" for n, (a, m, b) in shapes.items()))
        todo = ". Pair them with --map SLOW_NAME=FAST_NAME (a name or a module prefix)" \
            if missing or extra else _shapes_todo(sp, fp, shapes, slow_label, fast_label)
        raise ParameterMismatchError(
            ("the parameters do not pair by name: " if missing or extra else
             "the parameters pair by name, not by shape: ") + "; ".join(parts) + todo,
            missing=missing, extra=extra, shapes=shapes)
    return mapping


def _shapes_todo(sp: dict, fp: dict, shapes: dict, slow_label: str, fast_label: str) -> str:
    """What to do where every parameter pairs by name and ``shapes`` differ: check the
    ``--map`` that paired them (a review: a --map that swaps two layers was told 'built at
    different sizes'), make both one layout (a sparse parameter against a dense one), or build
    both at the same sizes, which no rename pairs (a review: --map was suggested for them)."""
    renamed = [(n, m) for n, (_, m, _) in shapes.items() if m != n]
    if renamed:
        return (". Check --map: it pairs " + ", ".join(f"{n} with {m}" for n, m in renamed[:3])
                + (f" and {len(renamed) - 3} more" if len(renamed) > 3 else ""))
    if all(sp[n].shape == fp[m].shape for n, (_, m, _) in shapes.items()):
        return (". A parameter is sparse on one side and dense on the other, which cannot be "
                "copied across: make both the same layout")
    return (f". Every name pairs: '{slow_label}' and '{fast_label}' are built at different "
            "sizes (do both read the same params, e.g. hidden?); --map cannot pair them")


def _shape(p: torch.Tensor):
    """A parameter's shape as a list, with its layout where it is not dense (a review: a sparse
    parameter against a dense one of the same shape raised in ``copy_``)."""
    shape = list(p.shape)
    return shape if p.layout == torch.strided else f"{shape} ({str(p.layout).split('.')[-1]})"


def _names(names, limit: int = 8) -> str:
    """Names, those under one top-level module grouped (``lins.* (4)``), so that an error line
    names both sides whole."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.split(".", 1)[0] if "." in n else n, []).append(n)
    parts = [g[0] if len(g) == 1 else f"{k}.* ({len(g)})" for k, g in groups.items()]
    return ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if len(parts) > limit
                                       else "")


def copy_parameters(slow: torch.nn.Module, fast: torch.nn.Module,
                    mapping: dict[str, str]) -> tuple[list[str], list[str]]:
    """Copy the slow model's parameters into the fast one (``mapping`` from
    :func:`parameter_mapping`), and its buffers of the same name, shape and layout (a user
    trial: a dense adjacency buffer and its sparse rewrite of the same name raised in
    ``copy_``); returns ``(buffers copied, fast buffers not copied)``."""
    sp, fp = dict(slow.named_parameters()), dict(fast.named_parameters())
    sb, fb = dict(slow.named_buffers()), dict(fast.named_buffers())
    copied, not_copied = [], []
    with torch.no_grad():
        for n, m in mapping.items():
            fp[m].copy_(sp[n].to(fp[m].device, fp[m].dtype))
        for n, b in fb.items():
            if n in sb and sb[n].shape == b.shape and sb[n].layout == b.layout:
                b.copy_(sb[n].to(b.device, b.dtype))
                copied.append(n)
            else:
                not_copied.append(n)
    return copied, not_copied
