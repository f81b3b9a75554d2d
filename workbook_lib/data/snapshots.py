"""Snapshots: the wildtype cell graph, from a spec (synthetic, cached) or a user's HeteroData.

The generator is deterministic in (spec, seed, scale). See ``data_snapshots/README.md`` for
what it guarantees (exact edge counts, nodes touched, heavy tails, no self-loops/duplicates,
directed edges, sorted by (dst, src)).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from ..exceptions import SnapshotError
from ..paths import resolve_path
from ..configs.filesystem import snapshot_spec_path
from ..configs.schema import DataSection
from ..common.files import temp_file_beside
from ..common.locks import locked

log = logging.getLogger(__name__)

GENERATOR_VERSION = 1
PARETO_SHAPE = 1.5


@dataclass
class CellGraph:
    """The wildtype gene graph: ``num_genes`` nodes, one directed ``edge_index`` per type.

    ``edge_index[t]`` is int64 ``[2, E_t]`` (row 0 source, row 1 target), sorted by (dst, src).
    """

    name: str
    num_genes: int
    edge_index: dict[str, torch.Tensor]
    source: str  # "spec" or "file"
    checksum: str  # sha256 of the graph content (for comparing runs)
    scale: float = 1.0
    spec: dict = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    @property
    def edge_types(self) -> list[str]:
        return list(self.edge_index)

    def num_edges(self, edge_type: str | None = None) -> int:
        if edge_type is not None:
            return int(self.edge_index[edge_type].shape[1])
        return int(sum(ei.shape[1] for ei in self.edge_index.values()))

    def nodes_touched(self, edge_type: str) -> int:
        return int(torch.unique(self.edge_index[edge_type]).numel())

    def to_hetero_data(self):
        """The graph as a PyG ``HeteroData``: node type ``gene`` (``num_nodes`` and ``node_id``),
        edge types ``("gene", t, "gene")`` (the edge indices are shared, not copied)."""
        from torch_geometric.data import HeteroData

        data = HeteroData()
        data["gene"].num_nodes = self.num_genes
        data["gene"].node_id = torch.arange(self.num_genes)
        for t, ei in self.edge_index.items():
            data["gene", t, "gene"].edge_index = ei
        return data

    def describe(self) -> str:
        return (f"{self.name} ({self.source}, scale {self.scale:g}): {self.num_genes:,} genes, "
                f"{len(self.edge_index)} edge types, {self.num_edges():,} edges")


# --------------------------------------------------------------------------- specs
def load_spec(name_or_path: str | Path) -> dict:
    """Read a snapshot spec (YAML) by name (``string12``) or path, checking its fields."""
    p = Path(name_or_path)
    if not p.suffix:
        sp = snapshot_spec_path(str(name_or_path))
        p = sp if sp is not None else p
    if not p.is_file():
        raise SnapshotError(f"snapshot spec {p} does not exist")
    with open(p) as fh:
        spec = yaml.safe_load(fh)
    for key in ("name", "num_genes", "edge_types"):
        if key not in spec:
            raise SnapshotError(f"snapshot spec {p}: missing key '{key}'")
    n = int(spec["num_genes"])
    for t, info in spec["edge_types"].items():
        if not {"nodes", "edges"} <= set(info):
            raise SnapshotError(f"snapshot spec {p}: edge type '{t}' needs 'nodes' and 'edges'")
        if not 0 < int(info["nodes"]) <= n:
            raise SnapshotError(f"snapshot spec {p}: '{t}' nodes must be in 1..{n}")
        if int(info["edges"]) > int(info["nodes"]) * (int(info["nodes"]) - 1):
            raise SnapshotError(f"snapshot spec {p}: '{t}' has more edges than node pairs")
    return spec


def scaled_sizes(spec: dict, scale: float) -> dict[str, tuple[int, int]]:
    """(nodes touched, edges) per type after scaling edge counts by ``scale``."""
    if scale <= 0:
        raise ValueError(f"'scale' must be positive (got {scale})")
    out = {}
    for t, info in spec["edge_types"].items():
        e = max(1, int(round(int(info["edges"]) * scale)))
        n = int(info["nodes"])
        n = min(n, max(2, e))
        # a directed simple graph on n nodes holds at most n(n-1) edges
        while n * (n - 1) < e:
            n += 1
        out[t] = (n, e)
    return out


# --------------------------------------------------------------------------- generator
def _type_rng(seed: int, edge_type: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(edge_type.encode())]))


def generate_edge_type(num_genes: int, nodes: int, edges: int,
                       rng: np.random.Generator) -> torch.Tensor:
    """One directed edge type: exactly ``edges`` edges touching exactly ``nodes`` genes.

    Heavy-tailed node weights (Pareto), no self-loops, no duplicates; sorted by (dst, src).
    """
    if nodes < 2 or nodes > num_genes:
        raise ValueError(f"'nodes' must be in 2..{num_genes} (got {nodes})")
    if not 1 <= edges <= nodes * (nodes - 1):
        raise ValueError(f"'edges' must be in 1..{nodes * (nodes - 1)} (got {edges})")
    if edges * 2 < nodes:
        raise ValueError(f"{edges} edges cannot touch {nodes} nodes")
    members = rng.choice(num_genes, size=nodes, replace=False).astype(np.int64)
    w = rng.pareto(PARETO_SHAPE, size=nodes) + 1.0
    for _ in range(3):  # cap hubs at half saturation so rejection sampling stays cheap
        cap = 0.5 * (nodes - 1) * w.sum() / edges
        w = np.minimum(w, cap)
    prob = w / w.sum()
    # coverage: every member touched once (pairs of a random order; odd one out -> weighted)
    order = rng.permutation(members)
    src = list(order[0:-1:2])
    dst = list(order[1::2])
    if nodes % 2 == 1:
        last = order[-1]
        partner = last
        while partner == last:
            partner = members[rng.choice(nodes, p=prob)]
        src.append(last)
        dst.append(partner)
    codes = np.asarray(src, np.int64) * num_genes + np.asarray(dst, np.int64)
    codes = np.unique(codes)  # cover pairs are distinct already
    # fill with weighted samples until exactly `edges` unique pairs
    while codes.size < edges:
        m = int((edges - codes.size) * 1.3) + 64
        s = members[rng.choice(nodes, size=m, p=prob)]
        d = members[rng.choice(nodes, size=m, p=prob)]
        keep = s != d
        new = s[keep] * num_genes + d[keep]
        cand = np.concatenate([codes, new])
        _, first = np.unique(cand, return_index=True)
        first.sort()
        codes = cand[first][:edges]  # keeps cover pairs (they come first)
    src = codes // num_genes
    dst = codes % num_genes
    order = np.lexsort((src, dst))
    return torch.from_numpy(np.stack([src[order], dst[order]]))


def generate(spec: dict, seed: int, scale: float) -> dict[str, torch.Tensor]:
    """Generate every edge type of a spec (deterministic in spec, seed and scale)."""
    sizes = scaled_sizes(spec, scale)
    n = int(spec["num_genes"])
    return {t: generate_edge_type(n, nodes, edges, _type_rng(seed, t))
            for t, (nodes, edges) in sizes.items()}


def content_checksum(num_genes: int, edge_index: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a graph's content (gene count, type names, edges) - equal graphs, equal sum."""
    h = hashlib.sha256()
    h.update(str(num_genes).encode())
    for t in sorted(edge_index):
        h.update(t.encode())
        h.update(edge_index[t].contiguous().numpy().tobytes())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_path(spec: dict, seed: int, scale: float, cache_dir: str | Path) -> Path:
    key = hashlib.sha256(json.dumps(
        {"spec": spec, "seed": seed, "scale": scale, "v": GENERATOR_VERSION},
        sort_keys=True).encode()).hexdigest()[:16]
    return resolve_path(str(cache_dir)) / f"{spec['name']}-seed{seed}-scale{scale:g}-{key}.pt"


def _atomic_save(obj, path: Path) -> None:
    fd, tmp = temp_file_beside(path)  # the umask's mode: a group's cache is shared
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_cache(path: Path, sha_path: Path) -> dict | None:
    if not path.is_file():
        return None
    expected = sha_path.read_text().strip() if sha_path.is_file() else None
    actual = _file_sha256(path)
    if expected != actual:
        log.warning("snapshot cache %s failed its checksum (expected %s, got %s): rebuilding it",
                    path, expected, actual)
        return None
    try:
        return torch.load(path, weights_only=True)["edge_index"]
    except Exception as exc:  # noqa: BLE001 - a damaged cache is rebuilt, not used
        log.warning("snapshot cache %s could not be read (%s): rebuilding it", path, exc)
        return None


def load_synthetic(spec_name: str, seed: int, scale: float,
                   cache_dir: str | Path = "data_snapshots/cache") -> CellGraph:
    """Generate (or load from the verified cache) the synthetic graph of a spec."""
    spec = load_spec(spec_name)
    path = cache_path(spec, seed, scale, cache_dir)
    sha_path = path.with_suffix(".sha256")
    edge_index = _read_cache(path, sha_path)  # the common case: no lock needed
    if edge_index is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # concurrent builders (SLURM jobs starting together, two notebooks) wait for each other
        with locked(path.with_suffix(".lock")):
            edge_index = _read_cache(path, sha_path)  # another process may have built it
            if edge_index is None:
                edge_index = generate(spec, seed, scale)
                _atomic_save({"edge_index": edge_index, "num_genes": int(spec["num_genes"])},
                             path)
                fd, tmp = temp_file_beside(sha_path)
                with os.fdopen(fd, "w") as fh:
                    fh.write(_file_sha256(path) + "\n")
                os.replace(tmp, sha_path)
    n = int(spec["num_genes"])
    return CellGraph(name=spec["name"], num_genes=n, edge_index=edge_index, source="spec",
                     checksum=content_checksum(n, edge_index), scale=scale, spec=spec)


def load_heterodata(path: str | Path) -> CellGraph:
    """Load a user's cell graph: a PyG ``HeteroData`` saved with ``torch.save``.

    It needs a ``gene`` node type and at least one ``('gene', relation, 'gene')`` edge type;
    other types are listed in ``CellGraph.ignored``. Edges are kept as stored (directed),
    sorted by (dst, src).
    """
    from torch_geometric.data import HeteroData

    p = resolve_path(str(path))
    if not p.is_file():
        raise SnapshotError(f"snapshot file {p} does not exist")
    try:
        data = torch.load(p, weights_only=False)  # the user's own file: a pickled HeteroData
    except Exception as exc:  # noqa: BLE001 - report any unpickling failure clearly
        raise SnapshotError(f"snapshot file {p} could not be loaded: {exc}") from exc
    if not isinstance(data, HeteroData):
        raise SnapshotError(f"snapshot file {p} holds a {type(data).__name__}, "
                            "expected a torch_geometric HeteroData")
    if "gene" not in data.node_types:
        raise SnapshotError(f"snapshot file {p} has no 'gene' node type "
                            f"(node types: {data.node_types})")
    n = data["gene"].num_nodes
    if not n:
        raise SnapshotError(f"snapshot file {p}: 'gene' has no num_nodes")
    edge_index, ignored = {}, []
    for et in data.edge_types:
        s, rel, d = et
        if s != "gene" or d != "gene":
            ignored.append("__".join(et))
            continue
        ei = getattr(data[et], "edge_index", None)
        if ei is None:
            raise SnapshotError(f"{p}: edge type {et} has no edge_index")
        if not isinstance(ei, torch.Tensor):
            raise SnapshotError(f"{p}: edge_index of {et} is a {type(ei).__name__}, expected a "
                                "tensor")
        if ei.is_floating_point() or ei.is_complex() or ei.dtype == torch.bool:
            raise SnapshotError(f"{p}: edge_index of {et} must hold integer node ids (its dtype "
                                f"is {ei.dtype})")
        ei = ei.long()
        if ei.dim() != 2 or ei.shape[0] != 2:
            raise SnapshotError(f"{p}: edge_index of {et} must be [2, E] (it is "
                                f"{list(ei.shape)})")
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
            raise SnapshotError(f"{p}: edge_index of {et} has node ids outside 0..{n - 1}")
        order = np.lexsort((ei[0].numpy(), ei[1].numpy()))
        edge_index[rel] = ei[:, torch.from_numpy(order)].contiguous()
    if not edge_index:
        raise SnapshotError(f"snapshot file {p} has no ('gene', relation, 'gene') edge type")
    return CellGraph(name=p.stem, num_genes=int(n), edge_index=edge_index, source="file",
                     checksum=content_checksum(int(n), edge_index), scale=1.0, ignored=ignored)


def load_snapshot(data: DataSection, *, scale: float | None = None) -> CellGraph:
    """The snapshot that validated params name.

    Args:
        data: the params' data section (``params.data``: snapshot, seed, scale, cache_dir).
        scale: overrides ``data.scale``.
    """
    name = data.snapshot
    if snapshot_spec_path(name) is None:
        return load_heterodata(name)
    return load_synthetic(name, data.seed, data.scale if scale is None else scale,
                          data.cache_dir)


def induced_subgraph(graph: CellGraph, num_genes: int) -> CellGraph:
    """The graph restricted to its ``num_genes`` genes with the most edges (all types), relabelled
    ``0..num_genes-1`` in that order, with the edges among them only (sorted by (dst, src))."""
    if not 2 <= num_genes <= graph.num_genes:
        raise ValueError(f"'num_genes' must be in 2..{graph.num_genes} (got {num_genes})")
    deg = torch.zeros(graph.num_genes, dtype=torch.long)
    for e in graph.edge_index.values():
        deg += torch.bincount(e.reshape(-1), minlength=graph.num_genes)
    chosen = torch.argsort(-deg, stable=True)[:num_genes]
    new_id = torch.full((graph.num_genes,), -1, dtype=torch.long)
    new_id[chosen] = torch.arange(num_genes)
    ei = {}
    for t, e in graph.edge_index.items():
        m = new_id[e]
        m = m[:, (m[0] >= 0) & (m[1] >= 0)]
        order = torch.argsort(m[1] * num_genes + m[0])
        ei[t] = m[:, order].contiguous()
    return CellGraph(name=f"{graph.name}[{num_genes} densest genes]", num_genes=num_genes,
                     edge_index=ei, source=graph.source, checksum=content_checksum(num_genes, ei),
                     scale=graph.scale, spec=graph.spec)
