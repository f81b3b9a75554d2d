"""The strategies of the investigation, one module each, behind one interface (``base.Strategy``)."""
from __future__ import annotations

from ..catalog import STRATEGY_NAMES
from ..strategies.base import FORMS, Strategy, build_ctx
from ..strategies.dango_wildtype import DangoWildtype
from ..strategies.device_mask import DeviceMaskLoop, DeviceMaskVectorized
from ..strategies.node_mask_shared import NodeMaskShared
from ..strategies.replicated_filter_device import ReplicatedFilterDevice
from ..strategies.replicated_mask_cpu import ReplicatedMaskCPU
from ..strategies.replicated_mask_stored import ReplicatedMaskStored
from ..strategies.subgraph_cpu import SubgraphCPU

REGISTRY: dict[str, type[Strategy]] = {cls.name: cls for cls in (
    SubgraphCPU, ReplicatedMaskCPU, ReplicatedMaskStored, DeviceMaskLoop,
    DeviceMaskVectorized, ReplicatedFilterDevice, NodeMaskShared, DangoWildtype)}
assert tuple(REGISTRY) == STRATEGY_NAMES

__all__ = ["REGISTRY", "FORMS", "Strategy", "build_ctx", "make_strategy"]


def make_strategy(name: str, graph, **kwargs) -> Strategy:
    """Build and prepare a strategy by name (see ``REGISTRY``)."""
    if name not in REGISTRY:
        raise ValueError(f"'strategy' must be one of {list(REGISTRY)} (got {name!r})")
    return REGISTRY[name](graph, **kwargs).prepare()
