"""One typed schema for every params file, every ``--set``, every papermill ``-p``/``-f`` and
every notebook's parameters cell: the names every caller imports, in one place.

The work is done in modules named for their jobs:

* :mod:`.schema`: the frozen, typed params dataclass (one field per key, with its default,
  documentation, section and check) and :data:`FIELDS`, the same keys described;
* :mod:`.checks`: the checks of single values, and the limits they enforce;
* :mod:`.specs`: ``pipelines`` entries parsed and checked as plain strings;
* :mod:`.loading`: the hardened YAML loader and reading a ``--params`` file;
* :mod:`.validation`: :func:`validate` (a mapping in, a :class:`Params` out, or one line on what
  is wrong; ``params.replace(key=value)`` a checked copy) and the checks that need several keys
  or the graph;
* :mod:`.filesystem`: what validating checks on disk (the snapshot, the cache folder);
* :mod:`.cells`: the help text and the notebooks' parameters cells.
"""
from __future__ import annotations

from ..exceptions import ParamsError
from .cells import NOTEBOOK_READS, describe, keys_read, parameters_cell
from .checks import MAX_BATCH, MAX_BUCKET_MB, MAX_INT, MAX_SEED, MAX_TIMEOUT_S
from .filesystem import max_scale, snapshot_spec_path
from .loading import (MAX_DEPTH, MAX_FILE_BYTES, MAX_MESSAGE, MAX_VALUES, check_size,
                      find_params_file, load_yaml, read_params_file, show)
from .schema import AGGRS, BACKENDS, DEVICES, FIELDS, PLACEMENT_KEYS, SCHEMA, Field, defaults
from .specs import NAME_RE, PipelineSpec, normalize, parse_specs, spec_file, spec_problem
from .validation import (Params, check_against_graph, check_gap, ddp_strategy,
                         load_params_file, max_k, mean_k, results_relevant, suggest,
                         unknown_key_error, validate)

__all__ = [
    "AGGRS", "BACKENDS", "DEVICES", "FIELDS", "MAX_BATCH", "MAX_BUCKET_MB", "MAX_DEPTH",
    "MAX_FILE_BYTES", "MAX_INT", "MAX_MESSAGE", "MAX_SEED", "MAX_TIMEOUT_S", "MAX_VALUES",
    "NAME_RE", "NOTEBOOK_READS", "PLACEMENT_KEYS", "SCHEMA", "Field", "Params", "ParamsError",
    "PipelineSpec", "check_against_graph", "check_gap", "check_size", "ddp_strategy", "defaults",
    "describe", "find_params_file", "keys_read", "load_params_file", "load_yaml", "max_k",
    "max_scale", "mean_k", "normalize", "parameters_cell", "parse_specs",
    "read_params_file", "results_relevant", "show", "snapshot_spec_path", "spec_file",
    "spec_problem", "suggest", "unknown_key_error", "validate",
]
