"""How notebook 03's report names and colours its modes and stages: one word and one colour per
stage in every chart (the profile's categories are the stages)."""
from __future__ import annotations

from .. import pipelines
from . import plotting


MODE_LABELS = {"data": "data only", "forward": "+ forward and loss",
               "forward_backward": "+ backward",
               "full": "+ optimizer (full step)"}


PIPELINED_LABEL = "pipelined (a plain loop's step, timed as one)"


STAGE_LABELS = {"data_item": "data item", "collate": "collate",
                "loader_wait": "data loading (fetch + collate)", "h2d": "host-to-device copy",
                "device_prep": "device prep (masks, filtering)", "forward": "forward",
                "loss": "loss", "loss_backward": "loss's backward", "backward": "backward",
                "optimizer": "optimizer", "untracked": "loop overhead"}


def label(name: str) -> str:
    return pipelines.label(name)


# one colour per stage in every chart of this report (the profile's categories are the stages)
STAGE_COLOURS = {"loader_wait": plotting.PALETTE[0], "h2d": plotting.PALETTE[1],
                 "device_prep": plotting.PALETTE[2], "forward": plotting.PALETTE[3],
                 "backward": plotting.PALETTE[4], "optimizer": plotting.PALETTE[5],
                 "untracked": plotting.PALETTE[6], "untracked (loop, Python)": plotting.PALETTE[6],
                 "loss": plotting.PALETTE[8], "loss_backward": plotting.PALETTE[9]}


# each mode in the colour of the stage it adds, as the stage charts below draw that stage
MODE_STAGE = {"data": "loader_wait", "forward": "forward", "forward_backward": "backward",
              "full": "optimizer"}


def mode_colour(mode: str) -> str:
    return STAGE_COLOURS[MODE_STAGE[mode]]


def stage_colour(stage: str, i: int) -> str:
    return STAGE_COLOURS.get(stage, plotting.PALETTE[(7 + i) % 10])
