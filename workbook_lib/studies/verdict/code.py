"""Where a cause's extra time is in the slow pipeline's own code: its profiled sites against the
fast pipeline's, function by function (notebook 03's profiles, :mod:`workbook_lib.traces.sites`).
"""
from __future__ import annotations

from collections import defaultdict

from ...measurement.profiling import NOT_OWN
from ...results.verdict import CodeLine, CodeSite
from ...traces.sites import operand_rank

# a cause's stage -> the profiled stages that hold it
PROFILED = {"data_item": ("data_item",), "collate": ("collate",), "h2d": ("h2d",),
            "device_prep": ("device_prep",), "forward": ("forward",),
            "loss": ("loss", "loss_backward"), "backward": ("backward",),
            "optimizer": ("optimizer",)}
MIN_SITE = 0.05  # a site below this share of the stage's extra time is not named
MOST = 3
# a library frame in graph code: PyG's convolutions and message passing (its generated propagate
# modules too), its GNN models (GraphSAGE, GCN, GIN...), dense convs, Sequential and to_hetero,
# its graph utilities and batching, torch_scatter and torch_sparse; not its MLP or Linear
GRAPH_CODE = ("torch_geometric/nn/conv/", "torch_geometric/nn/models/",
              "torch_geometric/nn/dense/dense_", "torch_geometric/nn/dense/diff_pool",
              "torch_geometric/nn/sequential", "torch_geometric/nn/to_hetero",
              "torch_geometric/utils/", "torch_geometric/data/", "_propagate_", "propagate (",
              "torch_scatter/", "torch_sparse/")
NOT_GRAPH_CODE = ("torch_geometric/nn/models/mlp.py",)
GRAPH_SHARE = 0.25  # a site with at least this share of its time under graph code runs it


def graph_code(library: str) -> bool:
    """A library frame (``"SAGEConv.forward (torch_geometric/nn/conv/sage_conv.py:120)"``) in
    graph code (:data:`GRAPH_CODE`)."""
    return bool(library) and any(k in library for k in GRAPH_CODE) and \
        not any(k in library for k in NOT_GRAPH_CODE)


def _by_function(profile, stages: tuple[str, ...], device: bool) -> dict:
    """(function, file, line) -> [seconds per step (the recorded steps' mean), ops per step,
    {library: seconds}, {line: [text, seconds per step, largest operand's dims, its operator]},
    [seconds in each recorded step] (empty for a results file from before they were kept),
    {caller: seconds through it}] (the callers' seconds in the same kind as the first item: a
    row's shares are of its kernel time where it ran any, else its host time)."""
    out: dict = defaultdict(lambda: [0.0, 0.0, defaultdict(float), {}, [], defaultdict(float)])
    for st in stages:
        for r in profile.sites.get(st, []):
            sec = r.device_seconds if device else r.seconds
            row = out[(r.function, r.file, r.line)]
            row[0] += sec
            row[1] += r.ops
            if r.library:
                row[2][r.library] += sec
            for by, share in zip(r.callers, r.caller_shares):
                row[5][by] += share * sec
            steps = r.step_device_seconds if device else r.step_seconds
            if steps:
                row[4] = [a + b for a, b in zip(row[4], steps)] if row[4] else list(steps)
            for ln in r.lines:
                hit = row[3].setdefault(ln.line, [ln.text, 0.0, [], ""])
                hit[1] += ln.device_seconds if device else ln.seconds
                if operand_rank(ln.dims) > operand_rank(hit[2]):
                    hit[2], hit[3] = list(ln.dims), ln.dims_op
    return out


def _leads(sa: dict, sb: dict, twin: dict, first) -> tuple[int, int, object]:
    """In how many of the recorded steps ``first`` (a key of ``sa``) had the largest extra time
    of the slow pipeline's own functions (each step's against the fast twin's same step, or its
    mean where the twin's steps were not kept), the steps recorded, and a function that had more
    in a step where it did not (None where it led in every one); (0, 0, None) where the steps
    were not kept."""
    n = len(sa[first][4])
    if n < 2:
        return 0, 0, None

    def extra(k, i: int) -> float:
        if not sa[k][4]:
            return float("-inf")
        fast = sb[twin[k]] if k in twin else None
        theirs = 0.0 if fast is None else (fast[4][i] if fast[4] else fast[0])
        return sa[k][4][i] - theirs

    led, rival = 0, None
    for i in range(n):
        best = max((k for k in sa if k[0] != NOT_OWN), key=lambda k: extra(k, i))
        if best == first or extra(best, i) <= extra(first, i):
            led += 1
        elif rival is None:
            rival = best
    return led, n, rival


def callers_of(row: list) -> tuple[list[str], list[float]]:
    """The own functions a site was called from, the most time first, as the answer names a
    function ("`g` (file:line)"), and each one's share of its time; ([], []) where none was
    recorded (:func:`_by_function`'s row)."""
    callers, total = row[5], row[0]
    top = sorted((c for c in callers if callers[c] > 0), key=lambda c: -callers[c])
    if not top or total <= 0:
        return [], []
    return ([f"`{name}` ({where}" for name, _, where in (c.rpartition(" (") for c in top)],
            [min(1.0, callers[c] / total) for c in top])


def code_lines(lines: dict, most: int = MOST) -> list[CodeLine]:
    """A function's lines, most operator time first (at most ``most``), each with its share
    of the time on all its marked lines.

    Args:
        lines: ``{line: [text, seconds per step, dims, operator]}`` (:func:`_by_function`'s
            last item).
    """
    total = sum(v[1] for v in lines.values())
    if total <= 0:
        return []
    top = sorted(lines.items(), key=lambda kv: -kv[1][1])[:most]
    return [CodeLine(n, text, sec * 1e3, sec / total, list(dims), op)
            for n, (text, sec, dims, op) in top if sec > 0]


def twins(slow_keys, fast_keys) -> dict:
    """Each slow function's counterpart among the fast pipeline's: the same function (file and
    line), else, for a pair kept in two files, the one fast function of the same qualified name
    (``GeneModel.forward`` in ``slow.py`` and in ``fast.py``) where each side has exactly one
    of that name and the fast one is no slow function's own; a function with none has none.

    Args:
        slow_keys, fast_keys: ``(function, file, line)`` of each side's sites.
    """
    fast_keys = set(fast_keys)
    out = {k: k for k in slow_keys if k in fast_keys}
    taken = set(out.values())
    names_slow: dict = defaultdict(list)
    names_fast: dict = defaultdict(list)
    for k in slow_keys:
        names_slow[k[0]].append(k)
    for k in fast_keys:
        names_fast[k[0]].append(k)
    for name, ks in names_slow.items():
        fs = names_fast.get(name, [])
        if name != NOT_OWN and len(ks) == 1 and len(fs) == 1 and ks[0] not in out and \
                fs[0] not in taken:
            out[ks[0]] = fs[0]
    return out


def code_sites(profiles: dict, slow: str, fast: str, stage: str,
               device_type: str = "cpu") -> tuple[list[CodeSite], str, float | None]:
    """The slow pipeline's functions that hold a stage's extra time against the fast one's (at most
    :data:`MOST`, each at least :data:`MIN_SITE` of it), why none are named, and the share of
    that time outside the pipeline's code (:data:`NOT_OWN`'s difference; None where not
    profiled). Shares are of the positive per-function differences, each function against its
    twin in the fast pipeline (:func:`twins`); on a GPU, device time where the stage has any.
    """
    stages = PROFILED.get(stage)
    if stages is None:
        return [], ("not attributed: this stage runs no code of the pipeline's (it is the "
                    "loop's)"), None
    a, b = profiles.get(slow), profiles.get(fast)
    if a is None or b is None:
        missing = slow if a is None else fast
        return [], f"not attributed: '{missing}' was not profiled", None
    for p in (a, b):
        if not p.sites:
            return [], p.sites_note or "not attributed: no Python frames in the profile", None
    device = device_type == "cuda" and any(r.device_seconds for st in stages
                                           for r in a.sites.get(st, []))
    sa, sb = _by_function(a, stages, device), _by_function(b, stages, device)
    twin = twins(list(sa), list(sb))
    diffs = {k: sa[k][0] - (sb[twin[k]][0] if k in twin else 0.0) for k in sa}
    extra = sum(d for d in diffs.values() if d > 0)
    if extra <= 0:
        return [], ("not attributed: no function of the slow pipeline takes longer than the "
                    "fast one's"), None
    outside = max(0.0, sum(d for k, d in diffs.items() if k[0] == NOT_OWN)) / extra
    bw = _by_function(a, ("backward", "loss_backward"), device) \
        if stage in ("forward", "loss", "device_prep") else None
    out = []
    for k, d in sorted(diffs.items(), key=lambda kv: -kv[1]):
        if d <= 0 or d / extra < MIN_SITE or k[0] == NOT_OWN or len(out) >= MOST:
            continue
        libs = sa[k][2]
        top = max(libs, key=libs.get) if libs else ""
        lib = top if top and libs[top] > 0.5 * sa[k][0] else ""
        graph = sum(sec for name, sec in libs.items() if graph_code(name))
        out.append(CodeSite(k[0], k[1], k[2], lib, sa[k][0] * 1e3,
                            (sb[twin[k]][0] if k in twin else 0.0) * 1e3, d / extra, sa[k][1],
                            graph / sa[k][0] if sa[k][0] > 0 else 0.0, code_lines(sa[k][3]),
                            sb[twin[k]][1] if k in twin else None,
                            (bw[k][0] * 1e3 if k in bw else 0.0) if bw is not None else None,
                            min(1.0, sum(libs.values()) / sa[k][0]) if sa[k][0] > 0 else 0.0,
                            *callers_of(sa[k])))
    if not out:
        return [], ("not attributed: the extra time is outside the pipeline's code (the loop, or "
                    "a library called from it)"), outside
    first = out[0]  # the first named: did every recorded step put it first?
    first.first_in, first.recorded, rival = _leads(sa, sb, twin,
                                                   (first.function, first.file, first.line))
    if rival is not None:
        first.rival = f"`{rival[0]}` ({rival[1]}:{rival[2]})"
    return out, "", outside
