"""A benchmark result in words: its summary lines (the ``bench`` command prints them), the CPU
share of each figure, and the shared form's speedup over a replicated form as measured (see
:mod:`.bench`)."""
from __future__ import annotations

from ..common.text import text_table
from ..results.bench import BenchResult
from ..results.cpu import FAULTS_HIGH, KEEP_PAGES, KERNEL_HIGH


def cpu_lines(r: BenchResult) -> list[str]:
    """What the process got of the CPUs while each variant was timed, and whether any was
    contended (the ratios built on a contended variant are)."""
    steps = dict(r.steps) | ({f"convert: {k}": st for k, st in r.convert.steps.items()}
                             if r.convert is not None else {})
    out = text_table([[f"CPU while timing {k}", st.cpu.describe()]
                      for k, st in steps.items() if st.cpu is not None])
    bad = [k for k, st in steps.items() if st.contended]
    if bad:
        out.append(f"CONTENDED: {', '.join(bad)}: the process got less than 80% of the CPU its "
                   "compute threads asked for; these figures and the ratios built on them are "
                   "not reliable")
        out.extend(f"  {k}: {steps[k].cpu.explain()}" for k in bad)
    heavy = [k for k, st in steps.items() if st.cpu is not None and st.cpu.kernel_bound]
    if heavy:
        out.append(f"KERNEL: {', '.join(heavy)}: at least {KERNEL_HIGH:.0%} of the CPU time "
                   f"while timing it was the kernel's, with at least {FAULTS_HIGH:,} page faults "
                   f"per CPU second (each one's figures above): {KEEP_PAGES}")
    return out


FORM_NAMES = {"replicated_gather_scatter": "Lazy form", "replicated_sparse": "sparse form"}


def replicated_ratio_text(b: BenchResult, key: str) -> str:
    """The shared form's per-sample speedup over replicated form ``key`` as measured, labelled
    with the batch the replicated figure was measured at ("at least 154x, Lazy form measured at
    B = 8" when it could not run at the shared form's batch and its per-sample cost rose with
    B), the projection from B = 1, 2 beside it with its measured error; "" without one."""
    st = b.ratio_vs_lazy_form if key == "replicated_gather_scatter" else b.ratio_vs_sparse_form
    if st is None:
        return ""
    fit = b.replicated.get(key)
    form = FORM_NAMES.get(key, key)
    if fit is None:
        return f"{st.median:.3g}x (IQR {st.iqr:.2g})"
    bound = "at least " if fit.at_least else ""
    text = f"{bound}{st.median:.3g}x (IQR {st.iqr:.2g}), {form} {fit.short_basis}"
    if not fit.measured and fit.projected_ratio is not None:
        text += (f"; projected from B = 1, 2 to B = {fit.at_batch}: "
                 f"{fit.projected_ratio.median:.3g}x, not quoted: {fit.error_text}")
    elif not fit.measured and fit.projected is not None and fit.projected.median <= 0:
        text += "; the projection from B = 1, 2 is noise (B = 2 not slower than B = 1)"
    return text


def convert_rows(r: BenchResult) -> list[list]:
    """The convert section's table, header first: form, B, ms per sample median [IQR] n and
    its ratio (measured, paired, in the same rounds; the floor's time is computed, at the best
    rates and, where they were timed in the rounds, at each round's); [] without one."""
    c = r.convert
    if c is None:
        return []

    def ratio(st, what):
        return "" if st is None else f"{st.median:.3g}x {what} [IQR {st.iqr:.2g}]"
    to_floor = c.to_floor()
    vs = {"torchcell_masked": ratio(c.masked_vs_converted, "the converted"),
          "torchcell_converted": "" if to_floor is None else
          f"{to_floor:.3g}x its floor's computed time",
          "own_converted": ratio(c.converted_vs_handwritten, "the hand-written"),
          "few_reach_masked": ratio(c.few_reach_masked_vs_converted, "the converted")}
    rows = [["form", "B", "ms/sample", "[IQR]", "n", "ratio"]]
    for k, v in c.forms.items():
        hot = " CONTENDED" if k in c.steps and c.steps[k].contended else ""
        rows.append([v.label, v.batch_size, f"{v.median * 1e3:.3g}{hot}",
                     f"[{v.iqr * 1e3:.2g}]", v.n, vs.get(k, "")])
    if c.loop is not None:
        lf = c.loop_to_floor()
        rows.append([c.loop.label, c.loop.batch_size, f"{c.loop.median * 1e3:.3g}",
                     f"[{c.loop.iqr * 1e3:.2g}]", c.loop.n,
                     "" if lf is None else f"{lf:.3g}x its floor's computed time"])
    if c.floor_seconds is not None:
        rows.append(["TorchCell-shaped, its floor (computed)", c.floor.batch_size,
                     f"{c.floor_seconds * 1e3:.3g}", "", "", f"at {c.floor_rates}"])
    same = c.floor_same_rounds
    if same is not None:
        sp, de = c.round_rates.get("sparse"), c.round_rates.get("dense")
        rates = "" if sp is None or de is None else \
            f"; rates sparse {sp.median:.3g} [IQR {sp.iqr:.2g}], dense {de.median:.3g} " \
            f"[IQR {de.iqr:.2g}] GMAC/s"
        rows.append(["TorchCell-shaped, converted / its floor at each round's rates",
                     c.floor.batch_size, "", "", same.n,
                     f"{same.median:.3g}x [IQR {same.iqr:.2g}] (same rounds{rates})"])
    shaped = c.floor_shaped_rounds
    if shaped is not None:
        de = c.round_rates.get("dense_shaped")
        rate = "" if de is None else \
            f"; its layer shape's dense rate {de.median:.3g} [IQR {de.iqr:.2g}] GMAC/s"
        rows.append(["TorchCell-shaped, converted / its floor, dense work at its layer "
                     "shape's rate", c.floor.batch_size, "", "", shaped.n,
                     f"{shaped.median:.3g}x [IQR {shaped.iqr:.2g}] (same rounds{rate})"])
    return rows


def part_rows(r: BenchResult) -> list[list]:
    """Where the converted TorchCell-shaped step's time goes, header first: each part's seconds
    per step (forward, backward), its floor's at the first rates and the ratio; [] without
    them."""
    c = r.convert
    if c is None or c.parts is None or not c.part_rows:
        return []
    rows = [["part", "s/step", "forward", "backward", "floor s/step", "x its floor"]]
    for p in c.part_rows:
        floor = "" if p.floor_s is None else f"{p.floor_s:.3g}"
        ratio = "" if p.ratio is None else f"{p.ratio:.3g}x"
        fwd_bwd = ["", ""] if p.forward_s == p.backward_s == 0 else \
            [f"{p.forward_s:.3g}", f"{p.backward_s:.3g}"]
        rows.append([p.label, f"{p.measured_s:.3g}", *fwd_bwd, floor, ratio])
    return rows


def part_caption(r: BenchResult) -> str:
    """What :func:`part_rows` shows, in words."""
    p = r.convert.parts
    sync = ("; the device synchronized around each part, which slows the step" if
            p.synchronized else "")
    return (f"where the converted TorchCell-shaped step's time goes (B = "
            f"{r.convert.floor.batch_size}): each part's own wall time per step, in a pass of "
            f"{p.steps} steps after the timed ones ({p.step_s:.3g} s per step{sync}); a part's "
            "backward is that of the converted form's own autograd functions, the rest is the "
            "backward of PyTorch's own operators (the readout module's, say), the loss and the "
            "glue; each beside its floor (forward and backward) at "
            f"{r.convert.floor_rates}")


def convert_lines(r: BenchResult) -> list[str]:
    """The convert section in words: its table (measured but the floor's line), what each
    figure is, exactness."""
    c = r.convert
    if c is None:
        return []
    masked = c.forms.get("torchcell_masked")
    out = ["convert section (forward + backward per exact sample, "
           f"{c.rounds} interleaved rounds):"] + text_table(convert_rows(r), "<>>>><")
    if masked is not None:
        out.append(f"masked copies at B = {masked.batch_size}: {masked.batch_reason}; masks "
                   "built outside the step (a data loader's work), convert's plan made in it")
        out.append("each step is timed after another form's (or a rate probe's) in its "
                   "round: a converted step after the masked copies' (which free gigabytes) "
                   "starts on memory they returned; 'back to back' times the converted step "
                   "again after the rounds, its steps in a row, as a training loop runs them")
    drift = floor_drift(c)
    if drift:
        out.append(drift)
    parts = part_rows(r)
    if parts:
        out += [part_caption(r) + ":"] + text_table(parts, "<>>>>>")
    out.append(f"few-reach graph: {c.few_reach_edges_per_type:,} edges sampled per type")
    errs = ", ".join(f"{k} {v:.1e}" for k, v in c.exact_max_rel_error.items())
    out.append(f"convert exact max rel. error on {c.exact_genes} genes: {errs} "
               "(TorchCell-shaped vs masked copies in float64; the workbook's model vs its "
               "hand-written form on kept genes in float32: the two differ only in the deleted "
               "genes' own rows, whose inputs convert zeroes)")
    return out


def floor_drift(c) -> str:
    """A line where the converted sample's ratio to its floor at the rates measured before the
    rounds and at each round's own rates differ by more than the latter's IQR (and 10%): the
    rates differ between the two measurements; '' where they agree or either is missing."""
    same, first = c.floor_same_rounds, c.to_floor()
    if same is None or first is None:
        return ""
    if abs(first - same.median) <= max(same.iqr, 0.1 * same.median):
        return ""
    sp, de = c.round_rates.get("sparse"), c.round_rates.get("dense")
    rates = "" if sp is None or de is None else \
        f" (rates in the rounds: sparse {sp.median:.3g}, dense {de.median:.3g} GMAC/s)"
    return (f"DRIFT: the converted sample is {first:.3g}x its floor at the rates measured before "
            f"the rounds ({c.floor_rates}) and {same.median:.3g}x [IQR {same.iqr:.2g}] at the "
            f"rates timed in each round{rates}: the rates differ between the two measurements "
            "(the machine's speed, or a probe's setup); the same-rounds ratio is the one "
            "measured alongside the step")


def summary_lines(r: BenchResult) -> list[str]:
    """A short plain-text summary (the CLI prints it): the variants' table, then one line per
    other figure."""
    s = r.sizes
    head = (f"bench on {r.device}: {s['edges']:,} edges, H={s['hidden']}, L={s['layers']}, "
            f"k={s['k']}; {r.rounds} interleaved rounds, {r.seconds:.0f} s; delta push kernel: "
            f"{r.push_kernel or 'none (no delta form ran)'}"
            + (f" ({r.push_threads} threads)" if r.push_threads else ""))
    variants = [["variant", "B", "ms/sample", "IQR", "n", ""]]
    for k, v in r.per_sample_s.items():
        what = v.batch_reason if k.startswith("repl") else v.label
        variants.append([k, v.batch_size, f"{v.median * 1e3:.2f}", f"{v.iqr * 1e3:.2f}", v.n,
                         f"({what})"])
    for k, f in r.replicated.items():
        if f.projected is not None:
            variants.append([f"{k} projected", f.at_batch, f"{f.projected.median * 1e3:.2f}",
                             f"{f.projected.iqr * 1e3:.2f}", f.projected.n,
                             "(from B = 1, 2: not quoted)"])
    rows = [[f"{k} projection", f.error_text] for k, f in r.replicated.items()]
    rows += [[k, f"skipped: {why}"] for k, why in r.skipped.items()]

    def show(label, st, text=None):
        if st is not None:
            rows.append([label, (text or f"{st.median:.3g} (IQR {st.iqr:.2g})")
                         + (" CONTENDED" if st.contended else "")])
    show("delta vs full form", r.ratio_vs_full_form)
    show("ratio vs Lazy model's form", r.ratio_vs_lazy_form,
         replicated_ratio_text(r, "replicated_gather_scatter"))
    show("ratio vs sparse form", r.ratio_vs_sparse_form,
         replicated_ratio_text(r, "replicated_sparse"))
    show("exact / DANGO-style sample", r.ratio_vs_dango_sample)
    show("wildtype steps per sample", r.passes_per_sample)
    if r.floor is not None:
        rows += [["floor" if i == 0 else "", x.replace("**", "")]
                 for i, x in enumerate(r.floor.lines())]
    for f in r.rates:
        best = f" (machine best {f.machine_gmacs:.3g}: {f.machine_source})" \
            if f.machine_gmacs else ""
        rows.append([f"{f.variant} {f.kind} GMAC/s",
                     f"{f.gmacs:.3g}, {f.seconds / f.step_seconds:.0%} of the step{best}"])
    rows += [[f"kernel {k.name}", f"{k.gmacs:.3g} GMAC/s"
              + (" (the step's)" if k.used_by_step else "")] for k in r.kernels]
    rows.append(["exact max rel. error", f"{r.exact_max_rel_error:.2e}"])
    return ([head] + text_table(variants, "<>>>><") + text_table(rows) + convert_lines(r)
            + cpu_lines(r) + [f"note: {n}" for n in r.notes])
