"""What the real torchrun launches of ``test_ddp.py`` and ``test_ddp_startup.py`` share: the
worker module, tiny params with their snapshot cached before any rank starts, and a worker's
config."""
import pytest

from workbook_lib.configs.validation import validate
from workbook_lib.data import snapshots

MODULE = "workbook_lib.distributed.worker"


@pytest.fixture(scope="module")
def tiny_params():
    """Params for launches of a few milliseconds a step."""
    p = validate({"scale": 0.002, "hidden": 4, "layers": 1, "device": "cpu",
                  "perturbation_k": 2, "grad_accum_steps": 2, "batch_size_lazy": 2,
                  "batch_size_dango": 4, "ddp_batch_size": 2, "exactness_genes": 10})
    snapshots.load_snapshot(p)  # cache it before ranks start
    return p


def config(p, steps=3, **extra):
    """A worker's config for a launch of ``steps`` steps, with ``extra`` (a planted fault)."""
    from workbook_lib.distributed.worker_config import WorkerConfig

    return WorkerConfig(**{"params": p, "scaling_strategy": "node_mask_shared",
                           "gap_strategies": ["replicated_mask_cpu", "dango_wildtype"],
                           "batch_size": 2, "global_batch": 4, "steps": steps,
                           "steps_cap": steps, "warmup": 1, "budget_s": 60, "timeout_s": 60,
                           **extra})
