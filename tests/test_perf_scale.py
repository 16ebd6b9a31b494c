"""Party A's memory-mapped CSR cache (common/csr_cache.py) and the scale benchmark's
pieces (benchmarks/perf/scale.py). The 1M/10M runs themselves are not tests: they take
minutes (docs/performance.md has their numbers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vesper.benchmarks.perf.scale import (
    GOAL_A_PEAK_MIB,
    GraphFile,
    PeakSampler,
    ScaleOptions,
    ScaleProfile,
    ScaleRun,
    generate_graph,
    graph_file,
    read_memory,
)
from vesper.benchmarks.perf.scale_report import figures_of
from vesper.common.csr_cache import CACHE_ENV, csr_cache_entry, drop_csr_cache, load_csr_part, write_symmetric_csr
from vesper.common.dataset_files import DatasetError, load_graph_part, resolve_dataset
from vesper.party_a.graph_store import build_graph
from vesper.party_a.run import GraphData


def save_graph(path: Path, edges: np.ndarray, features: np.ndarray, compressed: bool = False) -> Path:
    n = features.shape[0]
    save = np.savez_compressed if compressed else np.savez
    with open(path, "wb") as handle:
        save(handle, node_features=features, node_labels=np.zeros(n, dtype=np.int64), edges=edges)
    return path


def messy_edges(rng: np.random.Generator, n: int, m: int) -> np.ndarray:
    """Pairs in both directions, repeats and self-loops: what build_graph cleans up."""
    edges = rng.integers(0, n, size=(m, 2))
    return np.concatenate([edges, edges[: m // 3, ::-1], np.stack([edges[:5, 0], edges[:5, 0]], 1)])


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


def load(path: Path, memory_map: bool = True) -> GraphData:
    return GraphData.load(path, torch.device("cpu"), memory_map=memory_map)


def assert_same_graph(a: GraphData, b: GraphData) -> None:
    assert a.graph.num_nodes == b.graph.num_nodes
    assert a.graph.indptr.dtype == b.graph.indptr.dtype == torch.int64
    assert a.graph.indices.dtype == b.graph.indices.dtype == torch.int64
    assert torch.equal(a.graph.indptr, b.graph.indptr)
    assert torch.equal(a.graph.indices, b.graph.indices)
    assert a.features.dtype == b.features.dtype == torch.float32
    assert torch.equal(a.features, b.features)


@pytest.mark.parametrize("seed", range(6))
def test_memory_mapped_graph_equals_the_in_memory_build(tmp_path: Path, cache_root: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    edges = messy_edges(rng, n, int(rng.integers(0, 1500)))
    features = rng.standard_normal((n, 5)).astype(np.float32)
    path = save_graph(tmp_path / "g.npz", edges, features, compressed=seed % 2 == 1)
    assert_same_graph(load(path), load(path, memory_map=False))
    # the graph store's own builder too, and every chunking of the build gives the same bytes
    ref = build_graph(edges, n)
    for chunk in (1, 7, 1 << 22):
        part = load_csr_part(path, tmp_path / f"chunk{chunk}", chunk_pairs=chunk)
        assert np.array_equal(part.indptr, ref.indptr.numpy()) and np.array_equal(part.indices, ref.indices.numpy())


def test_cora_and_tolokers_layouts_give_the_same_graph(cache_root: Path) -> None:
    paths = [resolve_dataset("cora")]
    tolokers = Path("/work/shared/data/tolokers.npz")
    if tolokers.is_file():
        paths.append(tolokers)
    for path in paths:
        assert_same_graph(load(path), load(path, memory_map=False))


def test_the_tensors_are_views_of_the_mapped_files(tmp_path: Path, cache_root: Path) -> None:
    rng = np.random.default_rng(0)
    path = save_graph(tmp_path / "g.npz", messy_edges(rng, 50, 200), rng.standard_normal((50, 3)).astype(np.float32))
    part = load_csr_part(path)
    for array in (part.indptr, part.indices, part.features):
        assert isinstance(array, np.memmap) and array.filename is not None
        assert Path(array.filename).parent == part.entry
    assert torch.from_numpy(part.indices).data_ptr() == part.indices.ctypes.data  # no copy
    # copy-on-write: a write in this process never reaches the cache
    part.indices[0] = -7
    assert int(load_csr_part(path).indices[0]) != -7


def test_a_changed_file_gets_a_new_entry_and_the_old_one_goes(tmp_path: Path, cache_root: Path) -> None:
    rng = np.random.default_rng(1)
    features = rng.standard_normal((40, 3)).astype(np.float32)
    path = save_graph(tmp_path / "g.npz", np.array([[0, 1], [1, 2]]), features)
    first = load_csr_part(path)
    assert first.indices.tolist() == [1, 0, 2, 1]
    # same size, same shapes, other edges: the members' CRCs change the key
    stat = path.stat()
    save_graph(path, np.array([[0, 3], [3, 2]]), features)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    second = load_csr_part(path)
    assert second.entry != first.entry
    assert second.indices.tolist() == [3, 3, 0, 2]
    assert not first.entry.exists()
    assert [p.name for p in cache_root.iterdir()] == [second.entry.name]  # nothing temporary left
    # touching the file is a change too
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_csr_part(path).entry != second.entry
    assert drop_csr_cache(path) == 1 and not any(cache_root.iterdir())


def test_a_damaged_entry_is_built_again(tmp_path: Path, cache_root: Path) -> None:
    rng = np.random.default_rng(2)
    path = save_graph(tmp_path / "g.npz", messy_edges(rng, 30, 90), rng.standard_normal((30, 2)).astype(np.float32))
    entry = load_csr_part(path).entry
    expected = build_graph(messy_edges(np.random.default_rng(2), 30, 90), 30).indices.numpy()
    (entry / "indices.npy").write_bytes((entry / "indices.npy").read_bytes()[:-8])
    assert np.array_equal(load_csr_part(path).indices, expected)


def test_the_cache_goes_beside_the_file_else_to_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = save_graph(tmp_path / "g.npz", np.array([[0, 1]]), np.zeros((2, 1), dtype=np.float32))
    assert csr_cache_entry(path).parent == tmp_path / ".vesper-cache"
    # the package's bundled data is not a place to write, nor a directory without write bits
    # (which root could still write into)
    assert csr_cache_entry(resolve_dataset("cora")).parent == tmp_path / "xdg" / "vesper" / "graphs"
    shared = tmp_path / "shared"
    shared.mkdir()
    other = save_graph(shared / "g.npz", np.array([[0, 1]]), np.zeros((2, 1), dtype=np.float32))
    shared.chmod(0o555)
    try:
        assert csr_cache_entry(other).parent == tmp_path / "xdg" / "vesper" / "graphs"
    finally:
        shared.chmod(0o755)


def test_without_a_writable_cache_the_graph_is_built_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(not_a_directory))
    rng = np.random.default_rng(3)
    edges = messy_edges(rng, 40, 120)
    path = save_graph(tmp_path / "g.npz", edges, rng.standard_normal((40, 2)).astype(np.float32))
    part = load_csr_part(path, chunk_pairs=16)
    assert part.entry is None and not isinstance(part.indices, np.memmap)
    ref = build_graph(edges, 40)
    assert np.array_equal(part.indptr, ref.indptr.numpy()) and np.array_equal(part.indices, ref.indices.numpy())
    assert_same_graph(load(path), load(path, memory_map=False))


def test_bad_files_are_refused_as_the_in_memory_loader_refuses_them(tmp_path: Path, cache_root: Path) -> None:
    features = np.zeros((3, 2), dtype=np.float32)
    outside = save_graph(tmp_path / "outside.npz", np.array([[0, 3]]), features)
    nan = save_graph(tmp_path / "nan.npz", np.array([[0, 1]]), np.full((3, 2), np.nan, dtype=np.float32))
    for path, text in ((outside, "outside 0..2"), (nan, "NaN or Inf")):
        for loader in (load_graph_part, load_csr_part):
            with pytest.raises(DatasetError, match=text):
                loader(path)
    assert not any(p.name.endswith(".tmp") for p in cache_root.iterdir())


def test_the_build_sorts_one_range_of_sources_at_a_time(tmp_path: Path) -> None:
    """A hub with more pairs than a chunk gets a range of its own; the result is build_graph's."""
    hub = np.stack([np.zeros(50, dtype=np.int64), np.arange(1, 51)], 1)
    edges = np.concatenate([hub, hub, [[3, 4], [4, 3], [5, 5]]])
    indptr = write_symmetric_csr(edges, 60, tmp_path / "indices.npy", chunk_pairs=8)
    ref = build_graph(edges, 60)
    assert np.array_equal(indptr, ref.indptr.numpy())
    assert np.array_equal(np.load(tmp_path / "indices.npy"), ref.indices.numpy())


# -- the benchmark's pieces --------------------------------------------------------------------
def test_peak_sampling_reads_real_memory_of_a_process() -> None:
    # a child that touches 200 MiB, lets it go, and waits: VmHWM keeps the peak, VmRSS drops
    script = (
        "import sys, time\n"
        "block = bytearray(200 * 1024 * 1024)\n"
        "block[::4096] = b'x' * len(block[::4096])\n"
        "del block\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        reading = read_memory(child.pid)
        assert reading.hwm_kib >= 200 * 1024
        assert reading.rss_kib < reading.hwm_kib - 150 * 1024
        with PeakSampler({"child": child.pid, "me": os.getpid()}, every_s=0.01) as sampler:
            time.sleep(0.1)
            sampler.phase("later")
        assert sampler.samples >= 3
        assert sampler.peak_kib("child") >= 200 * 1024
        assert set(sampler.max_rss_kib) == {"start", "later"}
        assert 0 < sampler.max_rss_kib["later"]["me"] <= sampler.peak_kib("me")
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ProcessLookupError):
        read_memory(child.pid)


TINY = ScaleProfile(name="tiny", nodes=400, edges=1500, profile="sparse")


def test_a_generated_graph_is_reused_by_its_sidecar(tmp_path: Path) -> None:
    record = generate_graph(TINY, tmp_path / TINY.file_name())
    assert (record.nodes, record.edges) == (400, 1500)
    assert record.train_roots + record.eval_nodes == 400
    again = graph_file(TINY, tmp_path)  # no child process: the sidecar matches
    assert again.reused and again.path == record.path and again.edges == 1500


def _run(profile: ScaleProfile, a_peak_mib: float, status: str = "completed") -> ScaleRun:
    record = GraphFile(
        profile=profile, path=Path("x.npz"), nodes=profile.nodes, edges=profile.edges, train_roots=profile.nodes // 2,
        eval_nodes=profile.nodes // 2, generate_seconds=1.0, save_seconds=0.5, generate_peak_mib=100.0,
    )
    return ScaleRun(
        graph=record, options=ScaleOptions(), status=status, steps=10, load_seconds=1.0, epoch_seconds=5.0,
        eval_seconds=1.0, run_seconds=8.0, a_load_peak_mib=500.0, cache_build_seconds=0.5,
        peak_mib={"party-a": a_peak_mib, "party-b": 300.0, "accountant": 150.0},
        max_rss_mib={"train": {"party-a": a_peak_mib - 1, "party-b": 290.0, "accountant": 150.0}},
    )


def test_the_goal_is_party_a_under_4_gib_on_the_1m_graph() -> None:
    sparse = ScaleProfile(name="sparse-1m", nodes=1_000_000, edges=10_000_000, profile="sparse")
    dense = ScaleProfile(name="dense-100k", nodes=100_000, edges=10_000_000, profile="dense")
    [a, b, acc, epoch, gen] = figures_of(_run(sparse, 900.0))
    assert a.passed is True and a.goal == f"< {GOAL_A_PEAK_MIB:.0f} MiB" and a.value == 900.0
    assert (b.value, acc.value, epoch.value) == (300.0, 150.0, 5.0) and gen.value == 1.5
    assert all(f.passed is None for f in (b, acc, epoch, gen))
    assert a.command == "vesper bench perf --only scale"  # the default pair: no options
    missed = figures_of(_run(sparse, 5000.0))[0]
    assert missed.passed is False and "party-a" in missed.bound
    failed = figures_of(_run(sparse, 900.0, status="failed"))[0]
    assert failed.passed is False and "failed" in failed.bound
    assert figures_of(_run(dense, 5000.0))[0].passed is None  # reported, no goal


def test_step_phases_are_medians_of_the_trainers_timings(tmp_path: Path) -> None:
    from vesper.benchmarks.perf.scale import step_phases

    (tmp_path / "step_timings.json").write_text(
        '{"phases": ["release", "wait"], "steps": [[0.010, 0.001], [0.030, 0.003], [0.020, 0.002]], "ends": [1, 2, 3]}'
    )
    assert step_phases(tmp_path) == pytest.approx({"release": 20.0, "wait": 2.0, "step": 22.0})
    assert step_phases(tmp_path / "missing") == {}


@pytest.mark.slow
def test_one_epoch_through_the_services_is_measured(tmp_path: Path, cache_root: Path) -> None:
    from vesper.benchmarks.perf.scale import run_profile

    profile = ScaleProfile(name="tiny", nodes=3000, edges=20_000, profile="sparse")
    graph = generate_graph(profile, tmp_path / profile.file_name())
    run = run_profile(graph, tmp_path / "run", ScaleOptions(sample_every_s=0.05))
    assert run.status == "completed", run.message
    assert run.steps == -(-graph.train_roots // 256) and run.epsilon_spent == pytest.approx(8.0)
    assert run.cache_build_seconds is not None  # cold: party A built the cache of the file
    assert set(run.peak_mib) == {"accountant", "party-b", "party-a"} and min(run.peak_mib.values()) > 50
    assert run.peak_mib["party-a"] >= run.a_load_peak_mib > 50
    assert {"load", "train", "eval"} <= set(run.max_rss_mib)
    assert 0 < run.epoch_seconds < run.run_seconds and run.load_seconds > 0
    assert run.step_phases_ms.get("step", 0) > 0
    figures = figures_of(run)
    assert [f.unit for f in figures] == ["MiB", "MiB", "MiB", "s", "s"]


def test_a_big_graph_gets_chunks_that_read_its_edges_at_most_max_range_passes_times() -> None:
    from vesper.common.csr_cache import DEFAULT_CHUNK_PAIRS, MAX_RANGE_PASSES, chunk_pairs_for

    assert chunk_pairs_for(1000) == DEFAULT_CHUNK_PAIRS  # a small graph keeps the default
    for edges in (10_000_000, 100_000_000, 100_000_003):
        chunk = chunk_pairs_for(edges)
        assert chunk >= DEFAULT_CHUNK_PAIRS
        assert -(-2 * edges // chunk) <= MAX_RANGE_PASSES  # that many chunks (ranges a few more)
    assert chunk_pairs_for(100_000_000) == 12_500_000


def test_the_10m_profile_is_ten_times_the_1m_one_and_not_run_by_default() -> None:
    from vesper.benchmarks.perf.scale import DEFAULT_PROFILES, PROFILES

    big, small = PROFILES["sparse-10m"], PROFILES["sparse-1m"]
    assert (big.nodes, big.edges) == (10 * small.nodes, 10 * small.edges) == (10_000_000, 100_000_000)
    assert big.spec().resolved_mean_degree == small.spec().resolved_mean_degree == 20.0
    assert big.profile == small.profile and "sparse-10m" not in DEFAULT_PROFILES


def test_the_sampler_adds_the_processes_it_discovers_during_the_run(tmp_path: Path) -> None:
    from vesper.benchmarks.perf.scale import _WorkerFinder

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        finder = _WorkerFinder(tmp_path / "runs", "workers.json", expected=1)
        with PeakSampler({"me": os.getpid()}, every_s=0.01, discover=finder) as sampler:
            time.sleep(0.05)
            assert "party-a worker 1" not in sampler.pids  # no run directory yet
            (tmp_path / "runs" / "r1").mkdir(parents=True)
            (tmp_path / "runs" / "r1" / "workers.json").write_text(f'{{"pids": [{child.pid}]}}\n')
            time.sleep(0.1)
        assert sampler.pids["party-a worker 1"] == child.pid and finder.names == ["party-a worker 1"]
        assert sampler.peak_kib("party-a worker 1") > 1000  # a python process: several MiB
    finally:
        child.kill()
        child.wait()


def test_a_two_worker_run_reports_each_worker_and_party_as_whole() -> None:
    profile = ScaleProfile(name="sparse-10m", nodes=10_000_000, edges=100_000_000, profile="sparse")
    run = _run(profile, 900.0).model_copy(update={
        "options": ScaleOptions(workers=2), "worker_peak_mib": {"party-a worker 1": 700.0},
    })
    figures = figures_of(run)
    names = [f.name for f in figures]
    assert names[:3] == [
        "scale sparse-10m W=2: party A peak RSS (VmHWM)",
        "scale sparse-10m W=2: party-a worker 1 peak RSS (VmHWM)",
        "scale sparse-10m W=2: party A peak RSS, all its processes",
    ]
    assert figures[1].value == 700.0 and figures[2].value == 1600.0
    assert "W = 2 workers" in figures[0].measured and all(f.passed is None for f in figures)
    assert {f.command for f in figures[:4]} == {
        "vesper bench perf --only scale --scale-profile sparse-10m --scale-workers 2"
    }
    one = figures_of(_run(profile, 900.0))
    assert [f.name for f in one][0] == "scale sparse-10m: party A peak RSS (VmHWM)" and len(one) == 5
    assert one[0].command == "vesper bench perf --only scale --scale-profile sparse-10m"


def test_an_unknown_profile_is_refused_by_name() -> None:
    from vesper.benchmarks.perf.scale import scale_figures

    with pytest.raises(ValueError, match="unknown scale profile.*huge.*sparse-10m"):
        scale_figures(Path("unused"), ["huge"])


@pytest.mark.slow
def test_one_epoch_with_two_workers_is_measured_with_each_worker(tmp_path: Path, cache_root: Path) -> None:
    from vesper.benchmarks.perf.scale import run_profile

    profile = ScaleProfile(name="tiny", nodes=3000, edges=20_000, profile="sparse")
    graph = generate_graph(profile, tmp_path / profile.file_name())
    run = run_profile(graph, tmp_path / "run", ScaleOptions(sample_every_s=0.05, workers=2))
    assert run.status == "completed", run.message
    assert run.steps == -(-graph.train_roots // 256) and run.epsilon_spent == pytest.approx(8.0)
    assert list(run.worker_peak_mib) == ["party-a worker 1"] and run.worker_peak_mib["party-a worker 1"] > 50
    assert set(run.peak_mib) == {"accountant", "party-b", "party-a"}
    names = [f.name for f in figures_of(run)]
    assert "scale tiny W=2: party A peak RSS, all its processes" in names
