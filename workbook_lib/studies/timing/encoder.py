"""A pipeline's encoder against its conversion: for a pipeline that offers ``shared_encoder(batch)``,
the encoder on B masked copies of the gene graph (as a TorchCell-style pipeline runs it) and
:func:`workbook_lib.nodemask.convert`'s exact form, forward + backward on the same batches,
interleaved, with the conversion's floor; or the conversion's one-line refusal."""
from __future__ import annotations

import torch

from ...common.progress import note
from ...failures import PipelineFailure, failure_from
from ...measurement.timing import interleave
from ...nodemask.convert import ConvertError, ConvertedEncoder, convert
from ...results.timing import EncoderFigures

BATCHES = 3  # distinct batches of the pipeline's own samples, one per round in turn


def _edges(graph) -> dict:
    """``{key: edge_index}`` of an edge_index, a dict keyed by edge type or a HeteroData."""
    if isinstance(graph, torch.Tensor):
        return {None: graph}
    if isinstance(graph, dict):
        return dict(graph)
    return {t: graph[t].edge_index for t in graph.edge_types}


def masked_copies(x: torch.Tensor, graph, deleted: torch.Tensor):
    """``(x_B [B*N, F], graph_B)``: B copies of ``graph`` side by side, every edge touching a
    sample's deleted genes dropped and their input rows zeroed (``graph``'s own form).

    Args:
        x: ``[N, F]`` the encoder's input.
        graph: an edge_index ``[2, E]``, a dict of them keyed by edge type, or a HeteroData.
        deleted: ``[B, k]`` deleted genes, ``-1`` padded.
    """
    n, b = x.shape[0], deleted.shape[0]
    dev = x.device
    d = deleted.to(dev)
    keep = torch.ones(b, n + 1, dtype=torch.bool, device=dev)
    keep.scatter_(1, torch.where(d < 0, n, d), False)
    keep = keep[:, :n]
    xs = (x.unsqueeze(0) * keep.unsqueeze(-1)).reshape(b * n, -1)
    offs = (torch.arange(b, device=dev) * n).view(b, 1, 1)
    out = {}
    for key, ei in _edges(graph).items():
        ei = ei.to(dev)
        mask = (keep[:, ei[0]] & keep[:, ei[1]]).reshape(-1)
        out[key] = (ei.unsqueeze(0) + offs).permute(1, 0, 2).reshape(2, -1)[:, mask]
    return xs, (out[None] if None in out else out), keep


def runs_converted(pipe, batch, encoder: torch.nn.Module) -> bool:
    """Whether the pipeline's forward runs ``encoder`` converted already (a
    :class:`~workbook_lib.nodemask.convert.ConvertedEncoder` of it, in its model, is called by
    one forward of ``batch`` without gradients): the masked copies are then what copies would
    cost, not a gain left (found by a user trial: "3.9x" beside a forward that was already
    converted; a review: a model may hold a converted copy its training forward does not run)."""
    model = getattr(pipe, "model", None)
    held = [] if model is None else [m for m in model.modules()
                                     if isinstance(m, ConvertedEncoder) and m.encoder is encoder]
    if not held:
        return False
    fired: list[bool] = []
    handles = [m.register_forward_hook(lambda *_: fired.append(True)) for m in held]
    try:
        with torch.no_grad():
            pipe.forward(pipe.model, pipe.prepare(batch))
    finally:
        for h in handles:
            h.remove()
    return bool(fired)


def _batches(pipe, count: int) -> list:
    """``count`` prepared batches of the pipeline's own samples (collated, on its device)."""
    ds, bs = pipe.dataset(), pipe.batch_size
    count = max(1, min(count, len(ds) // bs))
    return [pipe.to_device(pipe.collate([ds[i] for i in range(j * bs, (j + 1) * bs)]), False)
            for j in range(count)]


def encoder_figures(pipe, *, device: torch.device, warmup: int, min_rounds: int, target: float,
                    max_time_s: float) -> EncoderFigures | None:
    """The encoder of ``pipe.shared_encoder`` on masked copies against its conversion, or None
    when the pipeline offers none.

    Args:
        pipe: a pipeline (the protocol's optional ``shared_encoder(batch)``).
        device, warmup, min_rounds, target, max_time_s: as :func:`measurement.timing.interleave`.
    """
    fn = getattr(pipe, "shared_encoder", None)
    if fn is None:
        return None
    batches = _batches(pipe, BATCHES)
    got = [fn(b) for b in batches]
    if got[0] is None:
        return None
    encoder, x, graph, _ = got[0]
    deleted = [g[3] for g in got]
    for d in deleted:  # one row per sample of the batch: a transposed [k, B] would pass convert
        if not isinstance(d, torch.Tensor) or d.dim() != 2 or d.shape[0] != pipe.batch_size:
            shape = list(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
            raise ValueError(f"shared_encoder returned 'deleted' of shape {shape}; it must be "
                             f"[B, k] with B = {pipe.batch_size}, one row per sample of the "
                             "batch (its deleted genes, -1 padded)")
    copies = [masked_copies(x, graph, d) for d in deleted]
    b, n = deleted[0].shape[0], x.shape[0]
    try:
        fast = convert(encoder, graph)
        with torch.no_grad():  # exactness of the timed pair, kept genes (the readouts' rows)
            xs, g, keep = copies[0]
            ref = encoder(xs, g).reshape(b, n, -1)[keep]
            conv = fast(x, deleted[0])[keep]
    except ConvertError as exc:  # at convert, or a mode only a call reveals (dropout)
        return EncoderFigures(batch_size=int(b), blocked=str(exc))
    err = float(((ref - conv).abs().max() / ref.abs().max().clamp(min=1e-30)).item())
    params = [p for p in encoder.parameters() if p.requires_grad]
    wrt = params + ([x] if x.requires_grad else [])
    turn = {"i": 0}

    def run_copies():  # the rows zeroed in the step, as the pipeline's forward does
        _, g, keep = copies[turn["i"]]
        out = encoder((x.unsqueeze(0) * keep.unsqueeze(-1)).reshape(-1, x.shape[1]), g)
        torch.autograd.grad(out.sum(), wrt, allow_unused=True)

    def run_converted():
        out = fast(x, deleted[turn["i"]])
        torch.autograd.grad(out.sum(), wrt, allow_unused=True)

    def next_round(_r: int) -> None:
        turn["i"] = (turn["i"] + 1) % len(batches)

    res = interleave({"masked copies": run_copies, "converted": run_converted}, device=device,
                     warmup=warmup, min_rounds=min_rounds, target=target, max_time_s=max_time_s,
                     on_round=next_round)
    floor = fast.floor(deleted[0])
    return EncoderFigures(
        runs_converted=runs_converted(pipe, batches[0], encoder),
        batch_size=int(deleted[0].shape[0]), masked_copies=res.stats["masked copies"],
        converted=res.stats["converted"], ratio=res.ratio("masked copies", "converted"),
        max_rel_error=err, floor_sparse_macs=floor.per_sample("sparse_macs"),
        floor_dense_macs=floor.per_sample("dense_macs"), all_changed_from=floor.all_changed_from,
        all_changed_macs=floor.all_changed_macs, explain=fast.explain(deleted[0]),
        num_genes=int(x.shape[0]))


def encoders_of(pipelines: dict, *, device: torch.device, warmup: int, min_rounds: int,
                target: float, max_time_s: float,
                failures: dict[str, PipelineFailure]) -> dict[str, EncoderFigures]:
    """:func:`encoder_figures` of every pipeline that offers an encoder; one whose
    ``shared_encoder`` raises is recorded in ``failures`` (stage "shared encoder"), its loop
    figures kept."""
    out = {}
    for name, pipe in pipelines.items():
        try:
            fig = encoder_figures(pipe, device=device, warmup=warmup, min_rounds=min_rounds,
                                  target=target, max_time_s=max_time_s)
        except Exception as exc:  # noqa: BLE001 - the pipeline's own encoder: recorded
            f = failure_from(exc, pipeline=name, notebook="03", stage="shared encoder")
            f.figures_kept = True
            failures.setdefault(name, f)
            note(f"03: {f.line()}")
            continue
        if fig is not None:
            out[name] = fig
    return out
