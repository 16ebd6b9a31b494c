"""Party A's two kernels against their references (issue #9, items 1b and 1c): the sampler here.

**Sampler** (:func:`sampler_figures`): one epoch of ``NeighbourSampler`` on Tolokers,
fanout [10, 10], batch 256, every node once as a root, against DGL 2.1's NeighborSampler +
DataLoader on the same graph, **measured in the same run**: with ``--peer-env PATH`` (a
virtual environment with DGL 2.1 and its torch 2.1, ``make bench-peer``) the graph is handed
to ``benchmarks/perf/dgl_peer.py`` under that environment's python before and after vesper's
epochs, and the ratio is of the medians. Without a peer environment the figure says DGL was
not measured; it is never compared with a constant. Timed for vesper: the per-step seed draw
and ``sample`` for every batch of a shuffled epoch, median of ``repeats`` epochs after one
warm-up epoch; the keyed order of the neighbour lists, built once per run, is timed apart
and reported beside it. An epoch over Tolokers' own training split is reported too.

**PMP layer** (:func:`vesper.benchmarks.perf.layer_figure.layer_figures`): in its own module.

A figure whose goal is missed carries the top lines of a torch.profiler run of what it
timed, and for the sampler the work that sets its floor (keys hashed per epoch).

Run alone: ``python -m vesper.benchmarks.perf.kernels [--dataset PATH] [--threads N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.benchmarks.perf.figures import PerfFigure
from vesper.party_a.graph_store import Graph
from vesper.party_a.sampler import KeyedOrder, NeighbourSampler, SampledSubgraph

SAMPLER_GOAL = 1.0  # ours / DGL's epoch time, both measured in the same run
PEER_SCRIPT = Path(__file__).with_name("dgl_peer.py")
ORDER_KEY = (0x5EED, 0x0DE7)  # the benchmark's stand-in for a run's secret order key
DEFAULT_DATASET = Path("../shared/data/tolokers.npz")
COMMAND = "vesper bench perf --only {source}"  # alone, with options: python -m vesper.benchmarks.perf.kernels
PROFILE_ROWS = 8


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Pin torch's intra-op threads for a measurement and restore them after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class TolokersGraph:
    graph: Graph
    train_roots: torch.Tensor

    @property
    def all_roots(self) -> torch.Tensor:
        return torch.arange(self.graph.num_nodes)


def load_graph(dataset_path: Path | str, device: str = "cpu") -> TolokersGraph:
    """A's graph from the file, and the file's training split (split 0, as B reads it)."""
    from vesper.common.dataset_files import load_graph_part, load_label_part
    from vesper.common.splits import split_for
    from vesper.party_a.graph_store import build_graph

    path = Path(dataset_path)
    part = load_graph_part(path)
    split = split_for(load_label_part(path), seed=0)
    graph = build_graph(part.edges, part.num_nodes).to(device)
    return TolokersGraph(graph, torch.from_numpy(split.train))


def _single_fanout(fanouts: Sequence[int]) -> int:
    if not fanouts or len(set(fanouts)) != 1:
        raise ValueError(f"A's sampler takes one fanout D for every layer, got {list(fanouts)}")
    return int(fanouts[0])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile_top(work: Callable[[], None], rows: int = PROFILE_ROWS) -> str:
    """torch.profiler's top operators (self CPU time) of one run of ``work``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=36)
    return "\n".join(line for line in table.splitlines() if line.strip())


# -- the sampler ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EpochCount:
    batches: int
    input_nodes: int  # Σ over batches of the input layer's distinct nodes
    frontier: int  # Σ over batches and layers of the nodes whose neighbours were sampled
    keys: int  # neighbour slots of the frontier nodes (what a sampler hashing every neighbour would read)
    messages: int  # sampled (destination, neighbour) pairs over all layers


def _epoch_batches(roots: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    return list(roots[torch.randperm(roots.numel(), generator=generator)].split(batch_size))


def sample_epoch(
    sampler: NeighbourSampler, batches: list[torch.Tensor], generator: torch.Generator
) -> list[SampledSubgraph]:
    """What one epoch of training asks of the sampler: per batch, fresh secret seeds and blocks."""
    return [sampler.sample(b, sampler.layer_seeds(generator)) for b in batches]


def count_epoch(graph: Graph, subgraphs: list[SampledSubgraph]) -> EpochCount:
    degree = graph.degree
    blocks = [block for sg in subgraphs for block in sg.blocks]
    keys = sum(int(degree[block.dst_nodes].sum()) for block in blocks)
    messages = sum(int(block.edge_dst.numel()) for block in blocks)
    inputs = sum(int(sg.input_nodes.numel()) for sg in subgraphs)
    frontier = sum(block.dst_count for block in blocks)
    return EpochCount(len(subgraphs), inputs, frontier, keys, messages)


def time_epochs(
    graph: Graph, roots: torch.Tensor, fanout: int, layers: int, batch_size: int, repeats: int, seed: int = 0,
    order: KeyedOrder | None = None,
) -> tuple[list[float], EpochCount]:
    """Wall seconds of ``repeats`` sampler epochs (after one warm-up epoch) and the last one's counts.
    ``order``: the run's keyed order, built beforehand (it is built once per run, not per epoch)."""
    sampler = NeighbourSampler(graph, fanout, layers, ORDER_KEY, order)
    order_generator = torch.Generator().manual_seed(seed)
    secret = torch.Generator().manual_seed(seed + 1)
    device = graph.device
    sample_epoch(sampler, _epoch_batches(roots, batch_size, order_generator), secret)  # warm-up
    seconds, subgraphs = [], []
    for _ in range(repeats):
        batches = _epoch_batches(roots, batch_size, order_generator)
        _synchronize(device)
        started = time.perf_counter()
        subgraphs = sample_epoch(sampler, batches, secret)
        _synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds, count_epoch(graph, subgraphs)


def keyed_order_seconds(graph: Graph, repeats: int = 3) -> tuple[float, KeyedOrder]:
    """Median seconds to build the run's keyed order of every neighbour list (once per run)."""
    seconds, order = [], None
    for _ in range(repeats):
        _synchronize(graph.device)
        started = time.perf_counter()
        order = KeyedOrder.of(graph, ORDER_KEY)
        _synchronize(graph.device)
        seconds.append(time.perf_counter() - started)
    assert order is not None
    return statistics.median(seconds), order


@dataclass(frozen=True)
class PeerEpochs:
    """DGL's epochs on the same graph, from the peer environment."""

    seconds: list[float]
    batches: int
    input_nodes: int
    versions: str


def peer_epochs(
    peer_env: Path, graph: Graph, roots: torch.Tensor, fanouts: Sequence[int], batch_size: int, repeats: int,
    threads: int, workdir: Path,
) -> PeerEpochs:
    """Run benchmarks/perf/dgl_peer.py under the peer environment's python on this graph."""
    import json
    import subprocess

    python = peer_env / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"--peer-env {peer_env}: no {python} (make bench-peer builds one)")
    workdir.mkdir(parents=True, exist_ok=True)
    graph_file = workdir / "peer-graph.npz"  # vesper's CSR itself: both sample the very same graph
    import numpy as np

    cpu = graph.to("cpu")
    np.savez(graph_file, indptr=cpu.indptr.numpy(), indices=cpu.indices.numpy(), roots=roots.cpu().numpy())
    done = subprocess.run(
        [str(python), str(PEER_SCRIPT), "--graph", str(graph_file), "--fanouts", *map(str, fanouts),
         "--batch", str(batch_size), "--repeats", str(repeats), "--threads", str(threads)],
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the DGL peer failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return PeerEpochs(
        result["seconds"], result["batches"], result["input_nodes"],
        f"DGL {result['dgl']}, torch {result['torch']}, {result['threads']} thread(s)",
    )


def _epoch_figure(
    seconds: list[float], count: EpochCount, peers: list[PeerEpochs], context: str, command: str,
    profile: Callable[[], str],
) -> PerfFigure:
    """The epoch against DGL's, measured in the same run; without peers, ours alone and 'not measured'."""
    ours = statistics.median(seconds)
    ours_text = f"ours {ours:.4f} s (median of {len(seconds)} epochs: {', '.join(f'{s:.4f}' for s in seconds)})"
    work = (
        f"{count.frontier:,} frontier nodes read {count.messages:,} messages: one binary search and at most D "
        f"reads per node in the run's keyed order"
    )
    if not peers:
        return PerfFigure(
            name="sampler epoch on Tolokers against DGL 2.1 (NeighborSampler + DataLoader)",
            value=round(ours, 4), unit="s", goal=f"<= {SAMPLER_GOAL:g} x DGL's, measured in the same run",
            measured=f"{ours_text}; DGL was not measured: no --peer-env (make bench-peer builds one). {context}. {work}.",
            command=command,
        )
    peer_seconds = [s for peer in peers for s in peer.seconds]
    theirs = statistics.median(peer_seconds)
    ratio = ours / theirs
    passed = ratio <= SAMPLER_GOAL
    return PerfFigure(
        name="sampler epoch on Tolokers against DGL 2.1 (NeighborSampler + DataLoader), measured in this run",
        value=round(ratio, 3), unit="x", direction="lower", goal=f"<= {SAMPLER_GOAL:g}", passed=passed,
        measured=(
            f"{ours_text} against DGL's {theirs:.4f} s (median of {len(peer_seconds)} epochs, half before and "
            f"half after ours: {', '.join(f'{s:.4f}' for s in peer_seconds)}; {peers[0].versions}; "
            f"{peers[0].batches} batches, {peers[0].input_nodes:,} input nodes). {context}. {work}."
        ),
        bound="" if passed else f"{work}. torch.profiler, one epoch:\n{profile()}", command=command,
    )


def sampler_figures(
    dataset_path: Path | str = DEFAULT_DATASET,
    fanouts: Sequence[int] = (10, 10),
    batch_size: int = 256,
    repeats: int = 5,
    threads: int = 1,
    device: str = "cpu",
    peer_env: Path | None = None,
    workdir: Path = Path(".vesper/perf/sampler"),
) -> list[PerfFigure]:
    """One sampler epoch on Tolokers against DGL 2.1's, measured in the same run with
    ``peer_env`` (ratio goal ≤ 1.0; without it: not measured), the keyed order's one-off
    build, and the epoch over the file's training split (reported)."""
    fanout, layers = _single_fanout(fanouts), len(fanouts)
    data = load_graph(dataset_path, device)
    command = COMMAND.format(source="sampler") + " --peer-env .peer-env"
    settings = f"fanout {list(fanouts)}, batch {batch_size}, {threads} torch thread(s), {device}"
    peers: list[PeerEpochs] = []
    with torch_threads(threads):
        build, order = keyed_order_seconds(data.graph)
        if peer_env is not None:  # DGL before and after vesper's epochs: both see the same machine
            peers.append(peer_epochs(peer_env, data.graph, data.all_roots, fanouts, batch_size, repeats, threads, workdir))
        seconds, count = time_epochs(data.graph, data.all_roots, fanout, layers, batch_size, repeats, order=order)
        if peer_env is not None:
            peers.append(peer_epochs(peer_env, data.graph, data.all_roots, fanouts, batch_size, repeats, threads, workdir))
        train_seconds, train_count = time_epochs(
            data.graph, data.train_roots, fanout, layers, batch_size, repeats, order=order
        )
        ours = statistics.median(seconds)
    check = f"{count.batches} batches, {count.input_nodes:,} input nodes summed over batches"
    print(f"sampler epoch (all nodes as roots): {check}; median {ours:.3f} s")
    print(f"sampler epoch (training split): {train_count.batches} batches, {train_count.input_nodes:,} input nodes; "
          f"median {statistics.median(train_seconds):.3f} s")
    profile = lambda: _profile_top(  # noqa: E731 - run only when the goal is missed
        lambda: sample_epoch(
            NeighbourSampler(data.graph, fanout, layers, ORDER_KEY, order),
            _epoch_batches(data.all_roots, batch_size, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1),
        )
    )
    epoch = _epoch_figure(seconds, count, peers, f"Every node once as a root: {check}. {settings}", command, profile)
    return [
        epoch,
        PerfFigure(
            name="the keyed order of every neighbour list, built once per run",
            value=round(build, 4), unit="s",
            measured=(
                f"median of 3 builds over {data.graph.indices.numel():,} slots (a key per slot, one sort); "
                f"{build / max(ours, 1e-9):.1f} epochs' worth of sampling, paid once per run; {settings}"
            ),
            command=command,
        ),
        PerfFigure(
            name="sampler epoch over Tolokers' training split",
            value=round(statistics.median(train_seconds), 4), unit="s",
            measured=(
                f"median of {len(train_seconds)} epochs ({', '.join(f'{s:.3f}' for s in train_seconds)}); "
                f"{train_count.batches} batches, {train_count.input_nodes:,} input nodes; {settings}"
            ),
            command=command,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", nargs="*", help="sampler, layer (default: both)")
    parser.add_argument("--dataset", type=Path, default=DEFAULT_DATASET)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--peer-env", type=Path, default=None, help="DGL 2.1's environment (make bench-peer)")
    args = parser.parse_args(argv)
    which = set(args.which or ("sampler", "layer"))
    if which - {"sampler", "layer"}:
        parser.error(f"unknown: {sorted(which - {'sampler', 'layer'})}; choose sampler, layer")
    figures: list[PerfFigure] = []
    extra = {} if args.repeats is None else {"repeats": args.repeats}
    if "sampler" in which:
        figures += sampler_figures(
            args.dataset, threads=args.threads, device=args.device, peer_env=args.peer_env, **extra
        )
    if "layer" in which:
        from vesper.benchmarks.perf.layer_figure import layer_figures  # it imports this module's helpers

        figures += layer_figures(args.dataset, threads=args.threads, device=args.device, **extra)
    for figure in figures:
        verdict = "reported" if figure.passed is None else ("pass" if figure.passed else "FAIL")
        print(f"{figure.name}: {figure.value:g} {figure.unit}  goal {figure.goal or '-'}  {verdict}")
        print(f"  {figure.measured}")
        if figure.bound:
            print("  bound: " + figure.bound.replace("\n", "\n    "))


if __name__ == "__main__":
    main()
