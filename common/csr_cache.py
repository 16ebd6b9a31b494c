"""Party A's graph as a memory-mapped CSR cache of a dataset file (common/dataset_files.py).

Party A does not rebuild its graph at every load: :func:`load_csr_part` builds the
symmetric, simple CSR (``indptr``, ``indices``) and the float32 features once per file
into a cache entry of ``.npy`` files and then memory-maps them (``mmap_mode="c"``: pages
are read from disk when first touched and shared with the page cache; a write would stay
private to the process and never reach the cache). The entry is keyed by the file's size,
mtime and the zip members' CRC-32s, so a changed file gets a new entry; it is written to
a temporary directory and renamed into place, so a crashed build leaves nothing a later
load would take for a cache. The build works through the edges by ranges of source nodes
(at most ``chunk_pairs`` directed pairs sorted at once; larger chunks for a graph so big
that it would be read more than about 16 times) and reads the ``.npz`` members
memory-mapped where they are stored uncompressed (``np.savez``), so a 10M-edge graph is
built in a few hundred MB.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from pydantic import BaseModel, ConfigDict

from vesper.common.dataset_files import (
    DatasetError,
    bundled_path,
    load_graph_part,
    open_archive,
    require_graph_layout,
)
from vesper.common.npz_files import NPZ_HEADERS

log = logging.getLogger(__name__)

CSR_CACHE_FORMAT = 1  # bump when what is stored, or how it is built, changes: old entries are then ignored
CACHE_ENV = "VESPER_GRAPH_CACHE"  # a cache root for every dataset, instead of one beside each file
CACHE_DIRNAME = ".vesper-cache"
MANIFEST = "manifest.json"

# Directed pairs sorted at once while building: 4M int64 keys are 32 MB, and np.unique's
# sort needs a few times that.
DEFAULT_CHUNK_PAIRS = 1 << 22
# Every range of source nodes reads all the edges once, so a graph of many ranges is read as
# many times (100M edges: 50 passes over 1.6 GB at the default chunk). Unless a chunk is given,
# a big graph gets chunks of 2 |E| / this, so it is read about this many times (a few more: a
# range ends at a node's boundary): 100M edges in ranges of up to 12.5M pairs (100 MB of keys,
# a few hundred MB for the sort).
MAX_RANGE_PASSES = 16
_EDGE_ROWS = 1 << 21  # edge rows read at once (32 MB of int64 pairs)
_FEATURE_BYTES = 1 << 25  # about this much of the features copied at once
_COPY_BYTES = 1 << 24


class CsrManifest(BaseModel):
    """What a cache entry holds; written last, so an entry with a manifest is complete."""

    model_config = ConfigDict(extra="forbid")

    format: int
    source: str
    source_key: str
    num_nodes: int
    num_slots: int  # 2 |E|: every undirected edge is stored in both rows
    num_features: int
    build_seconds: float


@dataclass(frozen=True)
class CsrPart:
    """Party A's graph from the cache: memory-mapped arrays, ready for ``torch.from_numpy``."""

    num_nodes: int
    indptr: np.ndarray  # int64 [N + 1]
    indices: np.ndarray  # int64 [2 |E|]; row v ascending, no self-loops, no repeats
    features: np.ndarray  # float32 [N, F]
    entry: Path | None  # None: built in memory, the cache could not be written


class CacheCorrupt(DatasetError):
    """A cache entry's files disagree with its manifest."""


def source_key(path: Path) -> str:
    """The cache key of a dataset file: its size, mtime and the CRC-32 of every zip member.

    The CRCs are read from the zip's directory, so the key costs no pass over the data,
    and a file rewritten with other content keeps no stale entry even if its size and
    mtime happened to match.
    """
    stat = path.stat()
    digest = hashlib.sha256(f"{CSR_CACHE_FORMAT}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                digest.update(f"|{info.filename}:{info.CRC}:{info.file_size}".encode())
    except (OSError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    return digest.hexdigest()[:20]


def csr_cache_root(path: Path) -> Path:
    """Where ``path``'s cache entries go: ``$VESPER_GRAPH_CACHE``, else a hidden directory
    beside the file when that directory is writable and has write bits (not a read-only
    data directory, not the package's bundled data), else the user's cache directory."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    parent = path.resolve().parent
    if parent != bundled_path("cora").parent and _writable_dir(parent):
        return parent / CACHE_DIRNAME
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no home directory to be found
            base = str(Path(tempfile.gettempdir()) / f"vesper-{os.getuid()}")
    return Path(base) / "vesper" / "graphs"


def _writable_dir(directory: Path) -> bool:
    """Writable for us and meant to be: root may write into a directory without write bits
    (a shared, read-only data directory), so the bits are checked as well as access()."""
    try:
        return os.access(directory, os.W_OK) and bool(directory.stat().st_mode & 0o222)
    except OSError:
        return False


def csr_cache_entry(path: Path, root: Path | None = None) -> Path:
    return (root or csr_cache_root(path)) / f"{path.stem}-{source_key(path)}"


def chunk_pairs_for(num_edges: int) -> int:
    """The chunk of a build that names none: the default, or larger for a graph whose edges
    would otherwise be read more than :data:`MAX_RANGE_PASSES` times."""
    return max(DEFAULT_CHUNK_PAIRS, -(-2 * num_edges // MAX_RANGE_PASSES))


def load_csr_part(path: Path, root: Path | None = None, chunk_pairs: int | None = None) -> CsrPart:
    """Party A's graph and features, memory-mapped from the cache; built first if missing.

    An entry whose files disagree with its manifest is removed and built again.
    """
    entry = csr_cache_entry(path, root)
    if (entry / MANIFEST).is_file():
        try:
            return open_csr_cache(entry)
        except CacheCorrupt:
            shutil.rmtree(entry, ignore_errors=True)
    try:
        build_csr_cache(path, entry, chunk_pairs)
    except OSError as exc:
        # no cache to be had (read-only or full disk): the graph is still A's, built in memory
        log.warning("cannot write the CSR cache of %s at %s (%s); building the graph in memory", path, entry, exc)
        return _in_memory_part(path, chunk_pairs)
    return open_csr_cache(entry)


def _in_memory_part(path: Path, chunk_pairs: int | None) -> CsrPart:
    edges, features = _graph_arrays(path)
    chunk_pairs = chunk_pairs or chunk_pairs_for(int(edges.shape[0]))
    num_nodes = int(features.shape[0])
    _check_edges(edges, num_nodes, path)
    blocks = list(_finite_feature_blocks(features, path))
    features = np.concatenate(blocks) if blocks else features.astype(np.float32)
    indptr, indices = symmetric_csr(edges, num_nodes, chunk_pairs)
    return CsrPart(num_nodes=num_nodes, indptr=indptr, indices=indices, features=features, entry=None)


def open_csr_cache(entry: Path) -> CsrPart:
    """Memory-map a complete entry; the checks are on shapes and ends only (no pass over the data)."""
    try:
        manifest = CsrManifest.model_validate_json((entry / MANIFEST).read_text())
        if manifest.format != CSR_CACHE_FORMAT:
            raise CacheCorrupt(f"{entry}: cache format {manifest.format}, expected {CSR_CACHE_FORMAT}")
        # copy-on-write: torch.from_numpy needs a writable array, and a write must not reach the file
        indptr = np.load(entry / "indptr.npy", mmap_mode="c", allow_pickle=False)
        indices = np.load(entry / "indices.npy", mmap_mode="c", allow_pickle=False)
        features = np.load(entry / "features.npy", mmap_mode="c", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CacheCorrupt(f"cannot read the cache entry {entry}: {exc}") from None
    n = manifest.num_nodes
    expected = {
        "indptr": (indptr, np.int64, (n + 1,)),
        "indices": (indices, np.int64, (manifest.num_slots,)),
        "features": (features, np.float32, (n, manifest.num_features)),
    }
    for name, (array, dtype, shape) in expected.items():
        if array.dtype != dtype or array.shape != shape:
            raise CacheCorrupt(
                f"{entry}: {name} is {array.dtype} {array.shape}, the manifest says {np.dtype(dtype)} {shape}"
            )
    if int(indptr[0]) != 0 or int(indptr[-1]) != manifest.num_slots:
        raise CacheCorrupt(f"{entry}: indptr does not span the {manifest.num_slots} slots")
    return CsrPart(num_nodes=n, indptr=indptr, indices=indices, features=features, entry=entry)


def build_csr_cache(path: Path, entry: Path, chunk_pairs: int | None = None) -> CsrManifest:
    """Build ``entry`` from ``path``: validate, symmetrise, de-duplicate, write, rename into place.

    Two processes building the same entry at once both succeed: the first rename wins and
    the second drops its copy (the two are the same bytes).
    """
    started = time.perf_counter()
    entry.parent.mkdir(parents=True, exist_ok=True)
    key = source_key(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
    try:
        edges, features = _graph_arrays(path)
        chunk_pairs = chunk_pairs or chunk_pairs_for(int(edges.shape[0]))
        num_nodes, num_features = int(features.shape[0]), int(features.shape[1])
        _check_edges(edges, num_nodes, path)
        _write_npy(tmp / "features.npy", np.float32, features.shape, _finite_feature_blocks(features, path))
        indptr = write_symmetric_csr(edges, num_nodes, tmp / "indices.npy", chunk_pairs)
        _write_npy(tmp / "indptr.npy", np.int64, indptr.shape, [indptr])
        del edges, features
        manifest = CsrManifest(
            format=CSR_CACHE_FORMAT, source=str(path.resolve()), source_key=key, num_nodes=num_nodes,
            num_slots=int(indptr[-1]), num_features=num_features,
            build_seconds=time.perf_counter() - started,
        )
        _write_synced(tmp / MANIFEST, manifest.model_dump_json().encode())
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / MANIFEST).is_file():
                raise
            # another process renamed the same entry into place first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _drop_stale_entries(entry, manifest.source)
    return manifest


def drop_csr_cache(path: Path, root: Path | None = None) -> int:
    """Remove every cache entry built from ``path`` (any version of it); how many were removed."""
    root = root or csr_cache_root(path)
    source = str(path.resolve())
    removed = 0
    for candidate in _entries_of_stem(root, path.stem):
        if _entry_source(candidate) == source:
            shutil.rmtree(candidate, ignore_errors=True)
            removed += 1
    return removed


def write_symmetric_csr(
    edges: np.ndarray, num_nodes: int, indices_path: Path, chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
) -> np.ndarray:
    """:func:`symmetric_csr_rows` written out: ``indices`` to ``indices_path`` (``.npy``), range
    by range; returns ``indptr`` (int64 [N + 1])."""
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    raw_path = indices_path.with_name(indices_path.name + ".raw")
    written = 0
    try:
        with open(raw_path, "wb") as raw:
            for lo, counts, dst in symmetric_csr_rows(edges, num_nodes, chunk_pairs):
                indptr[lo + 1 : lo + 1 + counts.size] = written + np.cumsum(counts)
                dst.tofile(raw)
                written += int(dst.size)
        with open(raw_path, "rb") as raw:
            _write_npy(indices_path, np.int64, (written,), _raw_blocks(raw))
    finally:
        raw_path.unlink(missing_ok=True)
    return indptr


def symmetric_csr(
    edges: np.ndarray, num_nodes: int, chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`symmetric_csr_rows` in memory: (indptr, indices)."""
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    pieces = []
    for lo, counts, dst in symmetric_csr_rows(edges, num_nodes, chunk_pairs):
        indptr[lo + 1 : lo + 1 + counts.size] = counts
        pieces.append(dst)
    np.cumsum(indptr, out=indptr)
    return indptr, np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


def symmetric_csr_rows(
    edges: np.ndarray, num_nodes: int, chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The CSR of :func:`vesper.party_a.graph_store.build_graph`, by ranges of source nodes.

    Every undirected pair (u, v) of ``edges`` ([M, 2], any direction, repeats and
    self-loops allowed) becomes the slots u→v and v→u; self-loops and repeats are dropped
    and each row is ascending, exactly as build_graph's sorted ``unique`` of ``src * N + dst``.
    Rather than sorting all 2M keys at once, the source nodes are cut into ranges [lo, hi)
    of at most ``chunk_pairs`` directed pairs (a node with more gets a range of its own),
    and each range's keys are sorted in turn: memory is the chunk, not the graph. Yields
    (lo, the degrees of rows lo..hi-1, their neighbours row after row), ranges in order.
    """
    if chunk_pairs < 1:
        raise ValueError(f"chunk_pairs must be >= 1, got {chunk_pairs}")
    n, m = num_nodes, int(edges.shape[0])
    pairs = np.zeros(n, dtype=np.int64)  # directed pairs per source, before dropping loops and repeats
    for block in _edge_blocks(edges):
        pairs += np.bincount(block[:, 0], minlength=n)
        pairs += np.bincount(block[:, 1], minlength=n)
    cumulative = np.cumsum(pairs)
    del pairs
    for lo, hi in _source_ranges(cumulative, chunk_pairs):
        unique = _sorted_unique(_range_keys(edges, lo, hi, n)) if m else np.empty(0, dtype=np.int64)
        rows, dst = np.divmod(unique, n)
        del unique
        yield lo, np.bincount(rows, minlength=hi - lo), dst


def _source_ranges(cumulative: np.ndarray, chunk_pairs: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges of source nodes holding at most ``chunk_pairs`` pairs each (or one node)."""
    n = int(cumulative.shape[0])
    lo = 0
    while lo < n:
        before = int(cumulative[lo - 1]) if lo else 0
        hi = int(np.searchsorted(cumulative, before + chunk_pairs, side="right"))
        hi = min(max(hi, lo + 1), n)
        yield lo, hi
        lo = hi


def _range_keys(edges: np.ndarray, lo: int, hi: int, n: int) -> np.ndarray:
    """Keys ``(src - lo) * n + dst`` of the directed pairs whose source is in [lo, hi), in both
    directions of every edge, without self-loops (repeats stay: the caller's unique drops them)."""
    keys = []
    for block in _edge_blocks(edges):
        for src, dst in ((block[:, 0], block[:, 1]), (block[:, 1], block[:, 0])):
            inside = (src >= lo) & (src < hi) & (src != dst)
            keys.append((src[inside] - lo) * n + dst[inside])
    return np.concatenate(keys)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """np.unique by sorting in place: numpy 2's np.unique hashes first and is several
    times slower on millions of int64 keys (profiled on Tolokers: docs/performance-notes.md)."""
    keys.sort()
    if keys.size < 2:
        return keys
    fresh = np.empty(keys.size, dtype=bool)
    fresh[0] = True
    np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
    return keys[fresh]


def _edge_blocks(edges: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, int(edges.shape[0]), _EDGE_ROWS):
        yield np.asarray(edges[start : start + _EDGE_ROWS], dtype=np.int64)


def _raw_blocks(handle: BinaryIO) -> Iterator[np.ndarray]:
    while chunk := handle.read(_COPY_BYTES):
        yield np.frombuffer(chunk, dtype=np.uint8)


def _graph_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(edges [M, 2], features [N, F]) of a dataset, memory-mapped where the file allows."""
    archive, layout = open_archive(path)
    archive.close()
    require_graph_layout(layout, path)  # the heterophily and graph layouts are read alike below
    if layout == "pitfalls":  # scipy CSR parts (Cora): small, read as load_graph_part does
        part = load_graph_part(path)
        return part.edges, part.features
    edges, features = _npz_member(path, "edges"), _npz_member(path, "node_features")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DatasetError(f"{path}: edges must have shape [M, 2], got {list(edges.shape)}")
    if features.ndim != 2:
        raise DatasetError(f"{path}: node features must have shape [N, F], got {list(features.shape)}")
    if not (np.issubdtype(edges.dtype, np.integer) and np.issubdtype(features.dtype, np.number)):
        raise DatasetError(
            f"{path}: edges must be integers and features numbers, got {edges.dtype} and {features.dtype}"
        )
    return edges, features


def _npz_member(path: Path, name: str) -> np.ndarray:
    """Array ``name`` of an ``.npz``: memory-mapped when the member is stored uncompressed
    (what ``np.savez`` writes), else read into memory."""
    with NPZ_HEADERS:
        return _read_member(path, name)


def _read_member(path: Path, name: str) -> np.ndarray:
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{name}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            with archive.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False)
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DatasetError(f"{path}: member {name} has no local zip header")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        handle.seek(info.header_offset + 30 + name_length + extra_length)
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        offset = handle.tell()
    if dtype.hasobject:
        raise DatasetError(f"{path}: member {name} holds Python objects")
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran_order else "C")


def _check_edges(edges: np.ndarray, num_nodes: int, path: Path) -> None:
    for block in _edge_blocks(edges):
        if block.size and (block.min() < 0 or block.max() >= num_nodes):
            raise DatasetError(f"{path}: an edge names a node outside 0..{num_nodes - 1}")


def _finite_feature_blocks(features: np.ndarray, path: Path) -> Iterator[np.ndarray]:
    rows = max(1, _FEATURE_BYTES // max(1, features.shape[1] * 4))
    for start in range(0, int(features.shape[0]), rows):
        block = np.ascontiguousarray(features[start : start + rows], dtype=np.float32)
        if not np.isfinite(block).all():
            raise DatasetError(f"{path}: node features contain NaN or Inf")
        yield block


def _write_npy(path: Path, dtype: type, shape: tuple[int, ...], blocks: Iterable[np.ndarray]) -> None:
    """A C-order ``.npy`` of ``shape``, its data written block by block (never whole in memory)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        start = handle.tell()
        for block in blocks:
            handle.write(memoryview(np.ascontiguousarray(block)).cast("B"))
        if handle.tell() - start != expected:
            raise RuntimeError(f"{path}: wrote {handle.tell() - start} bytes of data, expected {expected}")
        handle.flush()
        os.fsync(handle.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _entry_source(entry: Path) -> str | None:
    try:
        return CsrManifest.model_validate_json((entry / MANIFEST).read_text()).source
    except (OSError, ValueError):
        return None


def _drop_stale_entries(entry: Path, source: str) -> None:
    """Remove the entries of older versions of the same file (best effort: a process may still map them,
    which Linux allows: the pages live until it unmaps them)."""
    for candidate in _entries_of_stem(entry.parent, entry.name.rsplit("-", 1)[0]):
        if candidate != entry and _entry_source(candidate) == source:
            shutil.rmtree(candidate, ignore_errors=True)


def _entries_of_stem(root: Path, stem: str) -> list[Path]:
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith(f"{stem}-") and not p.name.startswith(".")]
