"""The command line's parser: every command, its arguments and their checks (argparse types: one
error each, exit status 2 before any work); each command runs a function of :mod:`.commands`."""
from __future__ import annotations

import argparse

from ..common.argtypes import (existing_file, int_at_least, nonempty_path, positive_float,
                               positive_int, writable_file)
from .commands import (DEFAULT_PARAMS, _cmd_bench, _cmd_compare, _cmd_equal, _cmd_html, _cmd_kernel,
                       _cmd_list, _cmd_notebooks, _cmd_params, _cmd_run, _cmd_selftest, _cmd_slurm,
                       _cmd_stability, _cmd_trace)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

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
