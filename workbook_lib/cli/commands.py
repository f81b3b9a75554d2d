"""What each command does: one function per command of :mod:`.parser`, run by :func:`main`."""
from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from pathlib import Path

from ..common.argtypes import writable_file
from ..configs.cells import describe
from ..configs.loading import load_yaml, read_params_file
from ..common.files import temp_for_a_while
from ..configs.validation import check_gap, validate
from ..exceptions import NotebookFailedError, ParamsError, WorkbookError

DEFAULT_PARAMS = "params/default.yaml"


def _load(path: str, sets: list[str] | None) -> dict:
    """A params file plus ``--set KEY=VALUE`` overrides, validated once."""
    src, raw = read_params_file(path)
    for item in sets or []:
        if "=" not in item:
            raise ParamsError(f"--set expects KEY=VALUE (got {item!r})")
        k, v = item.split("=", 1)
        raw[k.strip()] = load_yaml(v, "--set", key=k.strip())
    return validate(raw, source=str(src) + (" with --set" if sets else ""))


def _print(lines: list[str]) -> None:
    print("\n".join(lines))


def _cmd_list(args) -> int:
    from ..report.terminal import notebook_lines
    from ..running.notebooks import available_notebooks

    _print(notebook_lines(available_notebooks()))
    return 0


def _cmd_params(args) -> int:
    if args.file or args.set:
        from ..report.terminal import params_lines

        # --set without a file: the defaults (params/default.yaml) with the overrides
        _print(params_lines(_load(args.file or DEFAULT_PARAMS, args.set)))
    else:
        print(describe())
    return 0


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt (as SIGINT does) while the block runs."""
    def stop(signum, frame):
        raise KeyboardInterrupt

    sigs = (signal.SIGTERM, signal.SIGHUP)
    prev = {s: signal.signal(s, stop) for s in sigs} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)


def _check_verdict_inputs(args, p, names: list[str]) -> None:
    """ParamsError, before any work, where 05 runs without 03 and the run folder has no 03 of
    these params (found by a user trial: the notebook started, failed at its third cell, and
    its hint spelled every key of the params file as a --set)."""
    timing = "03_data_vs_model_timing"
    if "05_verdict" not in names or timing in names:
        return
    from ..running.results import params_differ, read_meta

    # what the run folder's records say (not its results, which the notebook reads and checks)
    meta = read_meta(args.out, timing)
    why = ("not run" if meta is None else "failed or incomplete" if not meta.complete else
           f"made with other params ({', '.join(params_differ(meta.params, p)[:3])})"
           if params_differ(meta.params, p) else "")
    if why:
        import shlex

        cmd = ["python", "-m", "workbook_lib", "run", "--params", str(args.params)]
        for kv in args.set or []:
            cmd += ["--set", kv]
        cmd += ["--out", str(args.out), "--only", "03", *(args.only or [])]
        raise ParamsError(f"--only: 05 needs notebook 03's timings in {args.out} ({why}); run "
                          f"03 with it: {shlex.join(cmd)}", key="only")


def continue_command(args) -> str:
    """The command that resumes an interrupted ``run``: its params, every ``--set``, its
    notebooks and flags, then ``--resume`` (found by a user trial: without the ``--set``s the
    hint reran the built-in strategies in place of the user's pipelines)."""
    import shlex

    parts = ["python", "-m", "workbook_lib", "run", "--params", str(args.params)]
    for kv in args.set or []:
        parts += ["--set", kv]
    parts += ["--out", str(args.out)]
    if args.only:
        parts += ["--only", *args.only]
    parts += [flag for flag, on in (("--show-code", args.show_code),
                                    ("--quiet", args.quiet)) if on]
    return shlex.join(parts + ["--resume"])


def _cmd_run(args) -> int:
    from ..running.notebooks import resolve_only

    p = _load(args.params, args.set)  # every check before any work (and before PyTorch loads)
    names = resolve_only(args.only)
    check_gap(p, names)
    _check_verdict_inputs(args, p, names)
    from ..report.html import write_index
    from ..report.terminal import run_lines
    from ..running.run_folder import run_notebooks
    if p.pipelines:
        from ..pipelines import preflight

        try:  # a user's pipeline can take a while to build: a signal here is an interrupt too
            with _signals_interrupt(), temp_for_a_while("workbook-preflight-"):
                # each user pipeline run on one batch as the notebooks will, nothing timed
                names = preflight(p, warn=lambda w: print(f"warning: {w}", file=sys.stderr),
                                  ddp="04_ddp_scaling" in names)
        except KeyboardInterrupt:
            print("\nINTERRUPTED while checking the pipelines: nothing was run or written.",
                  file=sys.stderr)
            return 130
        print(f"pipelines checked on one batch: {', '.join(names)}", file=sys.stderr)
    try:
        outcomes = run_notebooks(p, args.out, only=args.only, show_code=args.show_code,
                                 resume=args.resume, progress=not args.quiet,
                                 log_output=not args.quiet, write_index=write_index)
    except KeyboardInterrupt:
        kept = (f"finished notebooks are kept in {args.out}" if Path(args.out).is_dir() else
                "nothing was written yet (no run folder)")
        print(f"\nINTERRUPTED: the kernel and every process it started were stopped; {kept}. "
              f"Continue with: {continue_command(args)}", file=sys.stderr)
        return 130
    except NotebookFailedError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        print(f"Partial notebooks and reports (the failing cell marked) are in {args.out}; "
              "after fixing the cause, --resume reruns only what is incomplete.", file=sys.stderr)
        return 1
    _print(run_lines(outcomes, args.out))
    return 0


def _cmd_bench(args) -> int:
    p = _load(args.params, args.set)  # every check before any work (and before PyTorch loads)
    from ..studies.mask_cost.bench import run_bench
    from ..report.bench_text import summary_lines
    from ..common.device import configure_cpu_allocator
    from ..common.files import atomic_write_text
    from ..running.environment import configure_threads

    configure_cpu_allocator(p.cpu_allocator_cache)
    print(f"threads: {configure_threads(p)['why']}")
    res = run_bench(p, full_size=True if args.full_size else None)
    atomic_write_text(args.out, json.dumps(res.to_json(), indent=1))
    _print(summary_lines(res))
    print(f"Results: {args.out}")
    return 0


def _cmd_compare(args) -> int:
    from ..tools.compare import compare_runs
    from ..report.compare_view import write_page

    path = write_page(compare_runs(args.runs, force=args.force), args.out)
    print(f"Comparison: {path}")
    return 0


def _cmd_stability(args) -> int:
    p = _load(args.params, args.set)  # every check before any work (and before PyTorch loads)
    from ..tools.stability import run_stability
    from ..report.html import write_index
    from ..report.stability_view import summary_lines, write_page

    res = run_stability(p, args.out, runs=args.runs, tolerance=args.tolerance, only=args.only,
                        progress=not args.quiet, write_index=write_index)
    _print(summary_lines(res))  # one line per figure: label, each run's value, difference, status
    print(f"Report: {write_page(res, args.out)}")
    return 0 if not [r for r in res.disagreeing if r.verdict_rests_on] else 1


def _cmd_equal(args) -> int:
    from ..catalog import is_builtin
    from ..configs.specs import parse_renames, parse_specs, spec_problem

    try:
        renames = parse_renames(args.map)
    except ValueError as exc:
        raise ParamsError(str(exc), key="map") from None
    entries = [e for e in (args.slow, args.fast) if not is_builtin(e)]
    for e in entries:
        problem = spec_problem(e)
        if problem:
            raise ParamsError(f"{problem} (a pipeline spec: path/to/file.py:factory, "
                              f"package.module:factory, NAME=... or a built-in strategy)")
    names = {e: s.name for e, s in zip(entries, parse_specs(entries))}
    if len(entries) == 2 and names[args.slow] == names[args.fast]:  # a.py:f against b/a.py:f
        entries = [f"slow={args.slow.split('=', 1)[-1]}", f"fast={args.fast.split('=', 1)[-1]}"]
        names = {args.slow: "slow", args.fast: "fast"}
    slow, fast = (names.get(e, e) for e in (args.slow, args.fast))
    if slow == fast:
        raise ParamsError(f"SLOW and FAST are the same pipeline ({args.slow!r})")
    sets = list(args.set or [])
    if entries:  # the pair alone: keys that name the run's other pipelines follow it (a review:
        # 05's command on a run folder's params.yaml with a third pipeline in ddp_strategy)
        sets += [f"pipelines={json.dumps(entries)}", "ddp_strategy=null"]
        if len(entries) == 2:
            sets.append(f"gap_strategies={json.dumps([slow, fast])}")
    p = _load(args.params, sets)  # every check before any work
    from ..data.snapshots import load_snapshot
    from ..report.equality_view import table_lines
    from ..running.environment import resolve_device
    from ..studies.adoption.equality import check_equal

    graph, device = load_snapshot(p.data), resolve_device(p.device)
    try:
        res = check_equal(p, slow, fast, graph, device, renames=renames, batches=args.batches,
                          batch_size=args.batch_size, tolerance=args.tolerance,
                          mode="eval" if args.eval else "train")
    except WorkbookError:  # parameters that do not pair, a pipeline that cannot work: exit 2
        raise
    except ValueError as exc:  # a dataset too small for the batches asked
        raise ParamsError(str(exc)) from None
    if len(entries) == 2:  # two user pipelines: the outcome is kept for the verdict
        from ..studies.adoption import proofs

        slow_t, fast_t = (sp.target for sp in parse_specs(entries))
        kept = proofs.save(p.cache_dir, slow_t, fast_t, res.equal, res.summary())
        if kept is not None:
            print(f"Kept for the verdict: {kept}")
    _print(table_lines(res))
    if args.json:
        from ..common.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(res.to_json(), indent=1))
        print(f"Results: {args.json}")
    return 0 if res.equal else 1


def _cmd_slurm(args) -> int:
    from ..report.terminal import slurm_lines
    from ..running.slurm import write_scripts

    p = _load(args.params, args.set)
    # a pipeline file named relative to this folder is written as validated (absolute): the jobs
    # start in the repository
    sets = [f"pipelines={json.dumps(p['pipelines'])}" if s.split("=", 1)[0].strip() ==
            "pipelines" else s for s in args.set or []]
    paths = write_scripts(args.params, p, args.out_dir, run_dir=args.run_dir,
                          partition=args.partition, gpus_per_node=args.gpus, nodes=args.nodes,
                          time=args.time, cpus_per_task=args.cpus_per_task, mem=args.mem,
                          account=args.account, array=not args.single_job, force=args.force,
                          sets=sets)
    _print(slurm_lines(paths))
    return 0


def _trace_out(args) -> Path:
    """--out without its .html/.json suffix (default runs/trace-STEM[-vs-STEM]), writable."""
    if args.out:
        return args.out.with_suffix("") if args.out.suffix in (".html", ".json") else args.out

    def stem(p: str) -> str:
        name = Path(p).name
        for suf in (".gz", ".json", ".trace", ".pt"):
            name = name.removesuffix(suf)
        return name
    return writable_file("--out")(str(Path("runs") / (
        "trace-" + "-vs-".join(stem(p) for p in [args.trace, args.other] if p))))


def _cmd_trace(args) -> int:
    from .. import traces as ta
    from ..report.trace_view import summary_lines, write_report

    paths = [p for p in (args.trace, args.other) if p]
    traces = [ta.read_trace(p) for p in paths]  # both refused before any work if not traces
    out = _trace_out(args)
    bds = [ta.breakdown(t, depth=args.depth) for t in traces]
    names = [Path(p).name for p in paths]
    if len(names) == 2 and names[0] == names[1]:
        names = [str(p) for p in paths]
    dif = ta.diff(bds[0], bds[1]) if len(bds) == 2 else None
    html_path, json_path = write_report(bds, names, dif, out, top=args.top)
    _print(summary_lines(bds, names, dif))
    print(f"Report: {html_path}\nJSON:   {json_path}")
    return 0


def _cmd_notebooks(args) -> int:
    from ..running.notebooks import sync

    stale = sync(check=args.check)
    if args.check and stale:
        print("parameters cells out of date (run `make notebooks`): " + ", ".join(stale))
        return 1
    print("notebooks/*.ipynb built from their sources" if not args.check else "up to date")
    return 0


def _cmd_selftest(args) -> int:
    from ..tools.selftest import FAILED, format_table, run_selftest

    try:
        checks = run_selftest(args.device, args.ranks, args.params, args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(checks, args.device))
    return 1 if any(c.status == FAILED for c in checks) else 0


def _cmd_html(args) -> int:
    from ..running.papermill_run import export_html

    src = args.notebook
    try:
        import nbformat

        nbformat.read(str(src), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unreadable
        raise ParamsError(f"{src}: not a Jupyter notebook ({type(exc).__name__}: {exc})",
                          key="notebook") from None
    out = Path(args.out) if args.out else src.with_suffix(".html")
    replaced = out.exists()  # e.g. nbconvert's own export of the same notebook, beside it
    export_html(src, out, show_code=args.show_code)
    print(f"Report: {out}" + (" (it replaced the file that was there)" if replaced else ""))
    return 0


def _cmd_kernel(args) -> int:
    from ..running import kernel

    if args.remove:
        for removed in kernel.remove():
            print(f"removed {removed}")
        return 0
    if not args.check:
        print(f"registered {kernel.install()}")
    ok, where = kernel.check()
    print(where + ("" if ok else f": not this clone's Python ({sys.executable})"))
    return 0 if ok else 1


