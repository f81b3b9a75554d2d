"""A PyTorch Lightning ``LightningModule`` + ``LightningDataModule`` as a pipeline.

Drives the module's own hooks in Lightning's order without a ``Trainer``: the datamodule's
``train_dataloader`` (dataset, collate), ``on_before_batch_transfer`` /
``transfer_batch_to_device`` (transfer), ``on_after_batch_transfer`` (device prep),
``training_step`` through a wrapper module (forward), its returned ``loss``, and the first
optimizer of ``configure_optimizers``. ``self.log`` does nothing.

Why an adapter rather than a Lightning ``Callback`` or profiler: the workbook's four modes need
to run the data path without the model and the model without the optimizer, with a device sync
around each stage; a Trainer always runs the whole step. Lightning is an optional extra
(``pip install -e .[lightning]``).
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from .protocol import Pipeline


class _TrainingStep(torch.nn.Module):
    """``forward(batch, batch_idx)`` = the LightningModule's ``training_step``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, batch, batch_idx: int = 0):
        return self.module.training_step(batch, batch_idx)


class LightningPipeline(Pipeline):
    """Profile a ``LightningModule`` with its ``LightningDataModule`` through the workbook.

    Args:
        module: the LightningModule; device: where to train.
        datamodule: the LightningDataModule, or any object with ``train_dataloader()``.
        name: the pipeline's name when built alone (default: the module's class name); a run
            names it by its spec in ``pipelines`` (``NAME=`` or the factory's), whatever this is.

    Raises:
        ValueError: no ``training_step``, no ``train_dataloader``, or a loader without ``batch_size``.
    """

    per_sample_output = False  # training_step returns the loss

    def __init__(self, module, datamodule, device: torch.device | str = "cpu", *,
                 name: str = ""):
        for obj, attr in ((module, "training_step"), (datamodule, "train_dataloader")):
            if not callable(getattr(obj, attr, None)):
                raise ValueError(f"{type(obj).__name__} has no {attr}()")
        self.module, self.datamodule = module, datamodule
        self.device = torch.device(device)
        self.name = name or type(module).__name__
        self.title = f"the LightningModule {type(module).__name__}"
        for hook in ("prepare_data", "setup"):
            fn = getattr(datamodule, hook, None)
            if callable(fn):
                fn() if hook == "prepare_data" else fn("fit")
        loader = datamodule.train_dataloader()
        if getattr(loader, "batch_size", None) is None:
            raise ValueError("train_dataloader() must return a DataLoader with a batch_size "
                             "(a batch_sampler's batches cannot be re-formed by the workbook)")
        self._dataset, self._collate = loader.dataset, loader.collate_fn
        self.batch_size = int(loader.batch_size)
        self.model = _TrainingStep(module.to(self.device))
        self._step_index = 0

    def dataset(self):
        return self._dataset

    def collate(self, items: list) -> Any:
        return self._collate(items)

    def to_device(self, batch: Any, non_blocking: bool = False) -> Any:
        m = self.module
        batch = m.on_before_batch_transfer(batch, 0)
        return m.transfer_batch_to_device(batch, self.device, 0)

    def prepare(self, batch: Any) -> Any:
        return self.module.on_after_batch_transfer(batch, 0)

    def forward(self, model: torch.nn.Module, inputs: Any) -> Any:
        self._step_index += 1
        with warnings.catch_warnings():  # self.log without a Trainer: nothing to log to
            warnings.filterwarnings("ignore", message=".*self.log.*")
            warnings.filterwarnings("ignore", message=".*trainer.*")
            return model(inputs, self._step_index)

    def loss(self, output: Any, batch: Any) -> torch.Tensor:
        if isinstance(output, dict):
            output = output.get("loss")
        if not isinstance(output, torch.Tensor):
            raise ValueError(f"training_step must return the loss (a tensor or a dict with "
                             f"'loss'); got {type(output).__name__}")
        return output

    def configure_optimizer(self, parameters) -> torch.optim.Optimizer:
        """The first optimizer ``configure_optimizers`` returns (in any of Lightning's forms)."""
        conf = self.module.configure_optimizers()
        return _first_optimizer(conf)


def _first_optimizer(conf: Any) -> torch.optim.Optimizer:
    if isinstance(conf, torch.optim.Optimizer):
        return conf
    if isinstance(conf, dict):
        return _first_optimizer(conf.get("optimizer"))
    if isinstance(conf, (list, tuple)) and conf:
        return _first_optimizer(conf[0])
    raise ValueError(f"configure_optimizers returned no optimizer (got {type(conf).__name__})")
