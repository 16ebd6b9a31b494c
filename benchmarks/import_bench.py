"""``vesper bench import``: party A's import of a large Parquet edge file, timed, with its peak memory.

Issue #20's goal: importing a 10M-edge Parquet file takes under 2 GB of peak memory. The
command writes a synthetic Parquet edges file (``--edges`` rows of two text keys ``node-<i>``
drawn uniformly from ``--nodes`` keys, so some rows are self-loops and some repeat an edge)
and a features file over those keys (``--features`` float32 columns, the keys in a shuffled
order), then runs :func:`vesper.party_a.graph_import.import_graph` in a child process and
reads the child's own peak resident memory from the kernel (``os.wait4``'s ``ru_maxrss``:
the child alone, not this process that generated the files). The inputs are kept in
``OUT/inputs`` and reused by a later run with the same sizes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import typer
from pydantic import BaseModel
from rich.console import Console

console = Console()

GOAL_BYTES = 2 * 1000**3  # 2 GB
_CHUNK = 1 << 20


class ImportBenchResult(BaseModel):
    edges: int
    nodes: int
    features: int
    edges_file_mb: float
    wall_seconds: float
    import_seconds: float
    peak_rss_mb: float
    goal_mb: float
    ratio_to_goal: float
    edges_kept: int
    self_loops_dropped: int
    duplicate_edges_dropped: int
    python: str
    cpus: int


def _keys(ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("node-", pc.cast(pa.array(ids), pa.string()), "")


def write_inputs(directory: Path, edges: int, nodes: int, features: int, seed: int = 0) -> tuple[Path, Path]:
    """The Parquet edges and features files (written once per size; reused when present)."""
    directory.mkdir(parents=True, exist_ok=True)
    edges_path = directory / f"edges-{edges}-{nodes}-s{seed}.parquet"
    features_path = directory / f"features-{nodes}-{features}-s{seed}.parquet"
    rng = np.random.default_rng(seed)
    if not features_path.exists():
        order = rng.permutation(nodes)
        schema = pa.schema([("id", pa.string()), *((f"f{j}", pa.float32()) for j in range(features))])
        with pq.ParquetWriter(f"{features_path}.part", schema) as writer:
            for start in range(0, nodes, _CHUNK):
                ids = order[start : start + _CHUNK]
                values = rng.standard_normal((ids.size, features), dtype=np.float32)
                writer.write_batch(pa.record_batch([_keys(ids), *(pa.array(values[:, j]) for j in range(features))],
                                                   schema=schema))
        os.replace(f"{features_path}.part", features_path)
    if not edges_path.exists():
        schema = pa.schema([("src", pa.string()), ("dst", pa.string())])
        with pq.ParquetWriter(f"{edges_path}.part", schema) as writer:
            for start in range(0, edges, _CHUNK):
                size = min(_CHUNK, edges - start)
                ends = rng.integers(0, nodes, size=(2, size))
                writer.write_batch(pa.record_batch([_keys(ends[0]), _keys(ends[1])], schema=schema))
        os.replace(f"{edges_path}.part", edges_path)
    return edges_path, features_path


def measure(edges_path: Path, features_path: Path, store: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in bytes) of ``import_graph`` in a child process."""
    shutil.rmtree(store, ignore_errors=True)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "vesper.benchmarks.import_bench", str(edges_path), str(features_path), str(store)]
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"the import exited with {child.returncode}")
    return wall, usage.ru_maxrss * 1024.0  # KiB on Linux


def import_command(
    edges: int = typer.Option(10_000_000, "--edges", help="Edge rows of the synthetic Parquet file.", min=1),
    out: Path = typer.Option(Path("bench/import"), "--out", help="Directory for the inputs, the store and result.json."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Keys in the key space (default: edges / 10).", min=2),
    features: int = typer.Option(16, "--features", help="Feature columns of the features file.", min=1),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic files.", min=0),
) -> None:
    """Time and peak memory of `vesper data import --role party-a` on a large Parquet edges file."""
    nodes = nodes or max(2, edges // 10)
    console.print(f"writing the inputs ({edges} edges over {nodes} keys, {features} features) to {out / 'inputs'}")
    edges_path, features_path = write_inputs(out / "inputs", edges, nodes, features, seed)
    console.print("importing in a child process ...")
    wall, peak = measure(edges_path, features_path, out / "store")
    report = json.loads((out / "store" / "import-report.json").read_text())
    result = ImportBenchResult(
        edges=edges, nodes=nodes, features=features, edges_file_mb=round(edges_path.stat().st_size / 1e6, 1),
        wall_seconds=round(wall, 2), import_seconds=report["seconds"], peak_rss_mb=round(peak / 1e6, 1),
        goal_mb=GOAL_BYTES / 1e6, ratio_to_goal=round(peak / GOAL_BYTES, 3), edges_kept=report["edges_kept"],
        self_loops_dropped=report["self_loops_dropped"], duplicate_edges_dropped=report["duplicate_edges_dropped"],
        python=sys.version.split()[0], cpus=os.cpu_count() or 0,
    )
    (out / "result.json").write_text(result.model_dump_json(indent=2) + "\n")
    verdict = "under" if peak < GOAL_BYTES else "OVER"
    console.print(
        f"import of {edges} edges ({result.edges_file_mb} MB Parquet): {result.wall_seconds} s wall "
        f"({result.import_seconds} s in import_graph), peak RSS {result.peak_rss_mb} MB = "
        f"{result.ratio_to_goal:.2f} x the 2 GB goal ({verdict}); {result.edges_kept} edges kept, "
        f"{result.self_loops_dropped} self-loops and {result.duplicate_edges_dropped} duplicates dropped",
        highlight=False,
    )
    console.print(f"wrote {out / 'result.json'}", highlight=False)


def _child(argv: list[str]) -> None:
    from vesper.party_a.graph_import import import_graph

    edges_path, features_path, store = (Path(a) for a in argv)
    import_graph(edges_path, features_path, store)


if __name__ == "__main__":
    _child(sys.argv[1:])
