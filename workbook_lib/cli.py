"""Command line: ``python -m workbook_lib {run,list,params,bench,compare,equal,stability,slurm,...}``.

Every bad argument (a params file that is not YAML, a ``--set`` that does not parse, an ``--out``
that cannot be written) gets a one-line error and exit status 2 before any work; a failed
notebook exits 1 with a summary; an interrupt exits 130.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from .common.argtypes import (existing_file, int_at_least, nonempty_path, positive_float,
                              positive_int, writable_file)
from .configs import params as params_mod
from .exceptions import NotebookFailedError, ParamsError, WorkbookError

DEFAULT_PARAMS = "params/default.yaml"


def _load(path: str, sets: list[str] | None) -> dict:
    """A params file plus ``--set KEY=VALUE`` overrides, validated once."""
    src, raw = params_mod.read_params_file(path)
    for item in sets or []:
        if "=" not in item:
            raise ParamsError(f"--set expects KEY=VALUE (got {item!r})")
        k, v = item.split("=", 1)
        raw[k.strip()] = params_mod.load_yaml(v, "--set", key=k.strip())
    return params_mod.validate(raw, source=str(src) + (" with --set" if sets else ""))


def _print(lines: list[str]) -> None:
    print("\n".join(lines))


def _cmd_list(args) -> int:
    from .report.terminal import notebook_lines
    from .running.notebooks import available_notebooks

    _print(notebook_lines(available_notebooks()))
    return 0


def _cmd_params(args) -> int:
    if args.file or args.set:
        from .report.terminal import params_lines

        # --set without a file: the defaults (params/default.yaml) with the overrides
        _print(params_lines(_load(args.file or DEFAULT_PARAMS, args.set)))
    else:
        print(params_mod.describe())
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


def _cmd_run(args) -> int:
    from .report.html import write_index
    from .report.terminal import run_lines
    from .running.notebooks import resolve_only
    from .running.run_folder import run_notebooks

    p = _load(args.params, args.set)  # every check before any work
    names = resolve_only(args.only)
    params_mod.check_gap(p, names)
    if p["pipelines"]:
        from .pipelines import preflight

        try:  # a user's pipeline can take a while to build: a signal here is an interrupt too
            with _signals_interrupt():
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
              f"Continue with: python -m workbook_lib run --params {args.params} --out "
              f"{args.out} --resume", file=sys.stderr)
        return 130
    except NotebookFailedError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        print(f"Partial notebooks and reports (the failing cell marked) are in {args.out}; "
              "after fixing the cause, --resume reruns only what is incomplete.", file=sys.stderr)
        return 1
    _print(run_lines(outcomes, args.out))
    return 0


def _cmd_bench(args) -> int:
    from .studies.mask_cost.bench import run_bench, summary_lines
    from .common.device import configure_cpu_allocator
    from .common.files import atomic_write_text
    from .running.environment import configure_threads

    p = _load(args.params, args.set)
    configure_cpu_allocator(p["cpu_allocator_cache"])
    print(f"threads: {configure_threads(p)['why']}")
    res = run_bench(p, full_size=True if args.full_size else None)
    atomic_write_text(args.out, json.dumps(res.to_json(), indent=1))
    _print(summary_lines(res))
    print(f"Results: {args.out}")
    return 0


def _cmd_compare(args) -> int:
    from .tools.compare import compare_runs
    from .report.compare_view import write_page

    path = write_page(compare_runs(args.runs, force=args.force), args.out)
    print(f"Comparison: {path}")
    return 0


def _cmd_stability(args) -> int:
    from .tools.stability import run_stability
    from .report.html import write_index
    from .report.stability_view import summary_lines, write_page

    p = _load(args.params, args.set)
    res = run_stability(p, args.out, runs=args.runs, tolerance=args.tolerance, only=args.only,
                        progress=not args.quiet, write_index=write_index)
    _print(summary_lines(res))  # one line per figure: label, each run's value, difference, status
    print(f"Report: {write_page(res, args.out)}")
    return 0 if not [r for r in res.disagreeing if r.verdict_rests_on] else 1


def _cmd_equal(args) -> int:
    from .studies.adoption.equality import check_equal, parse_renames
    from .pipelines import is_builtin, parse_specs, spec_problem
    from .report.equality_view import table_lines

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
    if entries:
        sets.append(f"pipelines={json.dumps(entries)}")
    p = _load(args.params, sets)  # every check before any work
    from .data.snapshots import load_snapshot
    from .running.environment import resolve_device

    graph, device = load_snapshot(p), resolve_device(p["device"])
    try:
        res = check_equal(p, slow, fast, graph, device, renames=renames, batches=args.batches,
                          batch_size=args.batch_size, tolerance=args.tolerance,
                          mode="eval" if args.eval else "train")
    except WorkbookError:  # parameters that do not pair, a pipeline that cannot work: exit 2
        raise
    except ValueError as exc:  # a dataset too small for the batches asked
        raise ParamsError(str(exc)) from None
    _print(table_lines(res))
    if args.json:
        from .common.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(res.to_json(), indent=1))
        print(f"Results: {args.json}")
    return 0 if res.equal else 1


def _cmd_slurm(args) -> int:
    from .report.terminal import slurm_lines
    from .running.slurm import write_scripts

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
    from . import traces as ta
    from .report.trace_view import summary_lines, write_report

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
    from .running.notebooks import sync

    stale = sync(check=args.check)
    if args.check and stale:
        print("parameters cells out of date (run `make notebooks`): " + ", ".join(stale))
        return 1
    print("notebooks/*.ipynb built from their sources" if not args.check else "up to date")
    return 0


def _cmd_selftest(args) -> int:
    from .tools.selftest import FAILED, format_table, run_selftest

    try:
        checks = run_selftest(args.device, args.ranks, args.params, args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(checks, args.device))
    return 1 if any(c.status == FAILED for c in checks) else 0


def _cmd_html(args) -> int:
    from .running.papermill_run import export_html

    src = args.notebook
    try:
        import nbformat

        nbformat.read(str(src), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unreadable
        raise ParamsError(f"{src}: not a Jupyter notebook ({type(exc).__name__}: {exc})",
                          key="notebook") from None
    out = Path(args.out) if args.out else src.with_suffix(".html")
    export_html(src, out, show_code=args.show_code)
    print(f"Report: {out}")
    return 0


def _cmd_kernel(args) -> int:
    from .running import kernel

    if args.remove:
        for removed in kernel.remove():
            print(f"removed {removed}")
        return 0
    if not args.check:
        print(f"registered {kernel.install()}")
    ok, where = kernel.check()
    print(where + ("" if ok else f": not this clone's Python ({sys.executable})"))
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(
        prog="python -m workbook_lib",
        description="Perturbed-graph GNN performance workbook: measure why training is slow.")
    ap.add_argument("--version", action="version", version=f"workbook_lib {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def params_args(p, required=False):
        p.add_argument("--params", default=None if required else DEFAULT_PARAMS,
                       required=required, metavar="FILE", type=nonempty_path("--params"),
                       help="params YAML: a path, or a name in params/ (default: "
                            f"{DEFAULT_PARAMS})")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override one param (the value read as YAML), validated like the "
                            "file; repeat for several")

    sp = sub.add_parser("list", help="the notebooks, in execution order")
    sp.set_defaults(fn=_cmd_list)
    sp = sub.add_parser("params", help="every params key with its type, default and meaning; "
                                       "or validate a file")
    sp.add_argument("file", nargs="?", help="a params file to validate and print")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override one param before validating")
    sp.set_defaults(fn=_cmd_params)
    sp = sub.add_parser("run", help="execute the notebooks with papermill, write the reports")
    params_args(sp)
    sp.add_argument("--out", default="runs/default", metavar="DIR",
                    type=nonempty_path("--out"),
                    help="run folder (default runs/default)")
    sp.add_argument("--only", nargs="+", metavar="NB",
                    help="run only these notebooks: names or numbers (02, 2, 02_mask_cost_model)")
    sp.add_argument("--show-code", action="store_true",
                    help="keep the code cells in the HTML reports (hidden by default)")
    sp.add_argument("--resume", action="store_true",
                    help="keep notebooks complete with the same params, snapshot and inputs; "
                         "rerun the rest")
    sp.add_argument("--quiet", action="store_true",
                    help="no progress bars or kernel output; one-line stage notes only")
    sp.set_defaults(fn=_cmd_run)
    sp = sub.add_parser("bench", help="the strategy benchmark, per sample, interleaved; JSON")
    params_args(sp)
    sp.add_argument("--out", required=True, metavar="FILE.json",
                    type=writable_file("--out", example="bench.json", kind="JSON file"),
                    help="where the results go (e.g. RUN_FOLDER/bench.json, which the verdict "
                         "then quotes)")
    sp.add_argument("--full-size", action="store_true",
                    help="at the real spec (scale 1, H 64, 3 layers) whatever the params say")
    sp.set_defaults(fn=_cmd_bench)
    sp = sub.add_parser("compare", help="headline figures of two or more run folders side by "
                                        "side (HTML)")
    sp.add_argument("runs", nargs="+", metavar="RUN", help="run folders; the first is the "
                                                           "reference")
    sp.add_argument("--out", metavar="FILE.html", type=writable_file("--out"),
                    help="where to write (default runs/compare-A-vs-B.html)")
    sp.add_argument("--force", action="store_true", help="compare runs of different snapshots")
    sp.set_defaults(fn=_cmd_compare)
    sp = sub.add_parser("stability", help="run the notebooks twice (or more) and check that "
                                          "every headline figure agrees")
    params_args(sp)
    sp.add_argument("--runs", type=int_at_least("--runs", 2), default=2,
                    help="how many runs (default 2)")
    sp.add_argument("--out", default="runs/stability", metavar="DIR",
                    type=nonempty_path("--out"),
                    help="folder of the runs and the report (default runs/stability)")
    sp.add_argument("--tolerance", type=positive_float("--tolerance"), default=0.15,
                    help="relative difference allowed (default 0.15)")
    sp.add_argument("--only", nargs="+", metavar="NB", help="run only these notebooks")
    sp.add_argument("--quiet", action="store_true",
                    help="no progress bars or kernel output; one-line stage notes only")
    sp.set_defaults(fn=_cmd_stability)
    sp = sub.add_parser(
        "equal", help="check that a rewrite computes the same as the pipeline it replaces: "
                      "outputs, loss and every gradient on the same batch; exit 1 if not",
        description="Build SLOW and FAST (pipeline specs as in the 'pipelines' params key, or "
                    "built-in strategy names) from the same seed, pair their parameters by name "
                    "(refused, exit 2, when they do not pair), copy SLOW's parameters into FAST, "
                    "switch off their dropout modules, run the same batch through both in float64 "
                    "(float32 where a pipeline cannot, said so) and compare the outputs, the loss "
                    "and every parameter's gradient against rounding. Exit 0: equal; 1: they "
                    "differ; 2: bad input (a pipeline still random with dropout off included).")
    sp.add_argument("slow", metavar="SLOW", help="the reference pipeline (e.g. "
                                                 "examples/lazy_pyg.py:make_pipeline)")
    sp.add_argument("fast", metavar="FAST", help="the rewrite (e.g. "
                                                 "examples/nodemask_pyg.py:make_pipeline)")
    params_args(sp)
    sp.add_argument("--map", action="append", metavar="SLOW_NAME=FAST_NAME",
                    help="FAST names this parameter (or every parameter under this module "
                         "prefix) differently; repeat for several")
    sp.add_argument("--batches", type=positive_int("--batches"), default=1, metavar="N",
                    help="compare the first N batches (default 1)")
    sp.add_argument("--batch-size", type=positive_int("--batch-size"), default=None,
                    metavar="B",
                    help="samples per batch (default: SLOW's batch size)")
    sp.add_argument("--tolerance", type=positive_float("--tolerance"), default=None,
                    metavar="REL",
                    help="relative tolerance, in the precision the check runs (default: 1e-9 in "
                         "float64; in float32 derived from the graph and the layers, see "
                         "workbook_lib.measurement.precision)")
    sp.add_argument("--eval", action="store_true",
                    help="run both with every module in eval mode (default: training mode with "
                         "dropout modules switched off); for randomness outside dropout modules "
                         "that follows the module's training flag")
    sp.add_argument("--json", metavar="FILE.json", type=writable_file("--json"),
                    help="also write the table as JSON")
    sp.set_defaults(fn=_cmd_equal)
    sp = sub.add_parser("slurm", help="write sbatch scripts that run the workbook on a cluster")
    params_args(sp)
    sp.add_argument("--partition", help="SLURM partition (default: the cluster's default)")
    sp.add_argument("--account", help="SLURM account to charge")
    sp.add_argument("--gpus", type=int, default=0, metavar="N",
                    help="GPUs per node for notebook 04's DDP runs (default 0: CPU, gloo)")
    sp.add_argument("--nodes", type=int, default=1, metavar="N",
                    help="nodes for notebook 04's DDP runs (default 1)")
    sp.add_argument("--cpus-per-task", type=int, default=None, metavar="N",
                    help="CPUs per task (default: what sinfo reports for the partition, at most "
                         "8; 2 without sinfo)")
    sp.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 64G")
    sp.add_argument("--time", default="04:00:00", metavar="HH:MM:SS",
                    help="time limit of each job (default 04:00:00)")
    sp.add_argument("--single-job", action="store_true",
                    help="one job runs every notebook in order (default: one job per notebook, "
                         "each with its own resources, chained by dependencies)")
    sp.add_argument("--out-dir", default="runs/slurm", metavar="DIR",
                    type=nonempty_path("--out-dir"),
                    help="where the scripts and job logs go (default runs/slurm)")
    sp.add_argument("--run-dir", default=None, metavar="DIR",
                    type=nonempty_path("--run-dir"),
                    help="the run folder the jobs write (default runs/slurm-run: one folder, "
                         "so a resubmission resumes it)")
    sp.add_argument("--force", action="store_true",
                    help="overwrite scripts of another layout in --out-dir")
    sp.set_defaults(fn=_cmd_slurm)
    sp = sub.add_parser(
        "trace", help="break a torch.profiler Chrome trace down by exclusive time (by range, "
                      "kind, operator; per thread and GPU stream), or compare two; HTML and JSON",
        description="Break a Chrome trace written by torch.profiler (export_chrome_trace, "
                    "tensorboard_trace_handler's .json.gz, Lightning's PyTorchProfiler) down by "
                    "exclusive time: nested events are counted once, every thread, process and "
                    "GPU stream apart. With a second trace, the difference (per profiled step "
                    "when both have ProfilerStep# ranges).")
    sp.add_argument("trace", metavar="TRACE", help="a Chrome trace (.json or .json.gz)")
    sp.add_argument("other", nargs="?", metavar="OTHER",
                    help="a second trace to compare against the first")
    sp.add_argument("--out", metavar="PATH", type=writable_file("--out"),
                    help="where the report goes: PATH.html and PATH.json (default "
                         "runs/trace-NAME or runs/trace-NAME-vs-OTHER)")
    sp.add_argument("--depth", type=positive_int("--depth"), default=None, metavar="N",
                    help="group by the outermost N record_function ranges only (default: the "
                         "full path of nested ranges)")
    sp.add_argument("--top", type=positive_int("--top"), default=25, metavar="N",
                    help="operators shown per table in the HTML (default 25; the JSON has all)")
    sp.set_defaults(fn=_cmd_trace)
    sp = sub.add_parser("selftest", help="check this machine before a long run: exactness on "
                                         "the device, sync counts, the memory probe, timing "
                                         "synchronization, a DDP launch; exit 1 on a failure")
    sp.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    sp.add_argument("--ranks", type=int, default=None,
                    help="ranks of the DDP check (default: the GPUs visible; 1 on CPU: skipped)")
    sp.add_argument("--params", default=None, metavar="FILE",
                    help="params YAML for the sizes (default params/ci.yaml)")
    sp.add_argument("--only", action="append", metavar="CHECK",
                    help="run only these checks (exactness, syncs, memory, timing, cpu, ddp)")
    sp.set_defaults(fn=_cmd_selftest)
    sp = sub.add_parser("html", help="the HTML report of an executed notebook (e.g. papermill's "
                                     "output), as run writes it")
    sp.add_argument("notebook", type=existing_file(what="executed notebook"),
                    help="an executed .ipynb")
    sp.add_argument("--out", metavar="FILE.html", type=writable_file("--out"),
                    help="default: beside it, .html")
    sp.add_argument("--show-code", action="store_true", help="keep the code cells")
    sp.set_defaults(fn=_cmd_html)
    sp = sub.add_parser("kernel", help="register this clone's Jupyter kernel in its environment "
                                       "(make venv); --remove undoes it (make clean)")
    sp.add_argument("--remove", action="store_true", help="remove what registering made")
    sp.add_argument("--check", action="store_true",
                    help="only say where the kernel name resolves, and whether to this clone")
    sp.set_defaults(fn=_cmd_kernel)
    sp = sub.add_parser("notebooks", help="rebuild notebooks/*.ipynb from their sources "
                                          "(make notebooks)")
    sp.add_argument("--check", action="store_true",
                    help="only check the parameters cells are current")
    sp.set_defaults(fn=_cmd_notebooks)
    return ap


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        args = build_parser().parse_args(argv)  # a bad path or number: ArgumentError, below
        return args.fn(args)
    except WorkbookError as exc:
        print(f"error: {params_mod.one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {params_mod.one_line(f'{exc.strerror or exc}{where}')}", file=sys.stderr)
        return 2
