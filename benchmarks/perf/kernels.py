"""Party A's two kernels against their references (issue #9, items 1b and 1c).

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

**PMP layer** (:func:`layer_figures`): on subgraphs sampled as in training (same
settings, d = 64), forward + backward of PMP-GCN's and PMP-GIN's L layers exactly as
``PmpExtractor`` runs them — the no-gradient mechanism (aggregate, noise θ at every node
of every layer, layer), then each root's chain with gradient, backward from a gradient at
the B x d x L output — against a plain torch GCN: per block ``relu(Linear(Â h))`` with
``torch.sparse.mm`` and the block's normalised adjacency Â (the same coefficients
1/√((d̂_v+1)(d̂_u+1))), backward from the roots. Both start from the same h^(0) (a leaf
standing for the encoder's output, so the encoder, identical in both, is not timed) and
Â is built before the reference's timer starts, which favours the reference. Steps
alternate between the two, and the ratio is of the medians over ``batches`` subgraphs x
``repeats`` passes.

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
from vesper.common.config import ExtractorConfig
from vesper.party_a.encoder import GivenEncoding
from vesper.party_a.extractors.pmp import BlockMessages, PmpExtractor, ReleaseInputs
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource
from vesper.party_a.sampler import Block, KeyedOrder, NeighbourSampler, SampledSubgraph

SAMPLER_GOAL = 1.0  # ours / DGL's epoch time, both measured in the same run
PEER_SCRIPT = Path(__file__).with_name("dgl_peer.py")
ORDER_KEY = (0x5EED, 0x0DE7)  # the benchmark's stand-in for a run's secret order key
LAYER_GOAL = 1.3  # PMP / sparse-matrix GCN, forward + backward
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


# -- the PMP layer ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalSubgraph:
    """A sampled subgraph renumbered so that node i is the i-th input node.

    Every block's sources are a prefix of the input nodes (each layer's frontier starts
    with the layer above it), so renumbering only replaces the ids by ``arange``.
    """

    subgraph: SampledSubgraph  # with local ids
    capped_degree: torch.Tensor  # d̂ of the input nodes, by local id
    adjacency: list[torch.Tensor]  # the reference's Â per block, sparse [dst, src]


def localise(subgraph: SampledSubgraph, capped_degree: torch.Tensor) -> LocalSubgraph:
    inputs = subgraph.input_nodes
    blocks = []
    for block in subgraph.blocks:
        count = block.src_nodes.numel()
        if not torch.equal(block.src_nodes, inputs[:count]):
            raise ValueError("a block's sources are not a prefix of the input nodes")
        local = torch.arange(count, device=inputs.device)
        blocks.append(Block(block.dst_count, local, block.edge_dst, block.edge_src))
    roots = torch.arange(subgraph.roots.numel(), device=inputs.device)
    degree = capped_degree[inputs]
    return LocalSubgraph(SampledSubgraph(roots, blocks), degree, [normalised_adjacency(b, degree) for b in blocks])


def normalised_adjacency(block: Block, capped_degree: torch.Tensor) -> torch.Tensor:
    """Â[v, u] = 1/√((d̂_v+1)(d̂_u+1)) over the block's messages, coalesced sparse COO
    (``capped_degree`` by the block's own node ids; its destinations are its first sources)."""
    scale = torch.rsqrt(capped_degree.to(torch.float32) + 1)
    weight = scale[block.src_nodes[block.edge_dst]] * scale[block.src_nodes[block.edge_src]]
    indices = torch.stack([block.edge_dst, block.edge_src])
    size = (block.dst_count, block.src_nodes.numel())
    return torch.sparse_coo_tensor(indices, weight, size).coalesce()


class SparseGcn(torch.nn.Module):
    """The reference: per block h_dst = relu(Linear(Â h_src)) with torch.sparse.mm."""

    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, adjacency: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        for linear, a in zip(self.linears, adjacency):
            h = torch.relu(linear(torch.sparse.mm(a, h)))
        return h


def _pmp_model(
    name: str, layers: int, fanout: int, dim: int, capped_degree: torch.Tensor, spectral_norm: bool = True
) -> PmpExtractor:
    """PmpExtractor as the plugin builds it (the default config: spectral norm on, D_min = 1),
    its encoder replaced by the identity: h^(0) is given."""
    config = ExtractorConfig(name=name, layers=layers, fanout=fanout, dim=dim, spectral_norm=spectral_norm)
    model = PmpExtractor(config, dim, capped_degree)
    model.encoder = GivenEncoding()
    return model


@dataclass(frozen=True)
class Ahead:
    """A release's parts built by party A's prefetch: its blocks' messages and its inputs."""

    messages: list[BlockMessages] | None
    inputs: ReleaseInputs


@dataclass
class LayerBench:
    """One PMP variant and the reference on the same subgraphs, steps alternating."""

    local: list[LocalSubgraph]
    dim: int
    device: torch.device

    def __post_init__(self) -> None:
        self.inputs = torch.Generator(device=self.device).manual_seed(3)
        self.noise = NoiseSource(torch.Generator(device=self.device).manual_seed(2))

    def leaf(self, item: LocalSubgraph) -> torch.Tensor:
        """h^(0) of the subgraph's input nodes: non-negative, unit norm, a leaf that takes gradients."""
        rows = item.subgraph.input_nodes.numel()
        h = torch.rand(rows, self.dim, generator=self.inputs, device=self.device)
        return torch.nn.functional.normalize(h, dim=-1).requires_grad_()

    def ahead(self, model: PmpExtractor, item: LocalSubgraph, h0: torch.Tensor, noise_std: float) -> Ahead:
        """What party A's prefetch builds for a release while B computes (the blocks' messages;
        the input rows and the streamed noise draws), as the reference's Â is built outside its timer."""
        return Ahead(
            model.messages(item.subgraph, item.capped_degree),
            model.release_inputs(item.subgraph, h0, None, noise_std, self.noise),
        )

    def pmp_step(
        self, model: PmpExtractor, item: LocalSubgraph, h0: torch.Tensor, noise_std: float,
        built: Ahead | None = None,
    ) -> None:
        # each subgraph's degrees go in as the override that a subsampled release uses
        if built is None:
            built = self.ahead(model, item, h0, noise_std)
        out = model(item.subgraph, h0, noise_std, self.noise, item.capped_degree, built.messages, inputs=built.inputs)
        out.backward(torch.ones_like(out))

    def gcn_step(self, reference: SparseGcn, item: LocalSubgraph, h0: torch.Tensor) -> None:
        out = reference(item.adjacency, h0)  # the last block's destinations are the roots
        out.backward(torch.ones_like(out))

    def timed(self, work: Callable[[], None]) -> float:
        _synchronize(self.device)
        started = time.perf_counter()
        work()
        _synchronize(self.device)
        return time.perf_counter() - started

    def medians(
        self, model: PmpExtractor, reference: SparseGcn, noise_std: float, repeats: int
    ) -> tuple[float, float, int]:
        """Median seconds per step of PMP and of the reference, and the number of steps each."""
        for item in self.local[:2]:  # warm-up
            self.pmp_step(model, item, self.leaf(item), noise_std)
            self.gcn_step(reference, item, self.leaf(item))
        pmp_seconds: list[float] = []
        gcn_seconds: list[float] = []
        for rep in range(repeats):
            for index, item in enumerate(self.local):
                h_pmp, h_gcn = self.leaf(item), self.leaf(item)
                built = self.ahead(model, item, h_pmp, noise_std)
                runs = [
                    (pmp_seconds, lambda: self.pmp_step(model, item, h_pmp, noise_std, built)),  # noqa: B023 (run in this iteration)
                    (gcn_seconds, lambda: self.gcn_step(reference, item, h_gcn)),  # noqa: B023
                ]
                if (rep + index) % 2:
                    runs.reverse()  # alternate which runs first, so drift hits both alike
                for store, work in runs:
                    store.append(self.timed(work))
        return statistics.median(pmp_seconds), statistics.median(gcn_seconds), len(pmp_seconds)

    def ahead_median(self, model: PmpExtractor, noise_std: float) -> float:
        """Building a release's parts ahead (:meth:`ahead`), median seconds per subgraph."""
        return statistics.median(
            self.timed(lambda: self.ahead(model, item, self.leaf(item), noise_std)) for item in self.local  # noqa: B023
        )

    def mechanism_median(self, model: PmpExtractor, noise_std: float) -> float:
        """The no-gradient pass alone (aggregate, noise, layer over every frontier node)."""
        seconds = []
        for item in self.local:
            h0 = self.leaf(item)
            built = self.ahead(model, item, h0, noise_std)
            seconds.append(self.timed(lambda: model.noisy_aggregates(
                item.subgraph, h0, noise_std, self.noise, item.capped_degree, model.step_weights(), built.messages,  # noqa: B023
                inputs=built.inputs)))  # noqa: B023 (run in this iteration)
        return statistics.median(seconds)

    def profile(self, model: PmpExtractor, noise_std: float) -> str:
        leaves = [self.leaf(item) for item in self.local]
        ahead = [self.ahead(model, item, h0, noise_std) for item, h0 in zip(self.local, leaves)]

        def steps() -> None:
            for item, h0, built in zip(self.local, leaves, ahead):
                self.pmp_step(model, item, h0, noise_std, built)

        return _profile_top(steps)


def layer_bench(
    dataset_path: Path | str, fanouts: Sequence[int], batch_size: int, dim: int, batches: int, device: str,
) -> LayerBench:
    """``batches`` subgraphs sampled from the file's training roots as in training, on ``device``."""
    fanout, layers = _single_fanout(fanouts), len(fanouts)
    data = load_graph(dataset_path, device)
    graph = data.graph
    sampler = NeighbourSampler(graph, fanout, layers, ORDER_KEY)
    order, secret = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    roots = _epoch_batches(data.train_roots, batch_size, order)[:batches]
    capped = graph.degree.clamp(max=fanout) if fanout else graph.degree
    return LayerBench([localise(sg, capped) for sg in sample_epoch(sampler, roots, secret)], dim, torch.device(device))


def layer_models(bench: LayerBench, name: str, layers: int, fanout: int) -> tuple[PmpExtractor, SparseGcn]:
    """``name``'s layers and the sparse GCN reference, on the bench's device, from seed 0."""
    torch.manual_seed(0)
    reference = SparseGcn(bench.dim, layers).to(bench.device)
    model = _pmp_model(name, layers, fanout, bench.dim, bench.local[0].capped_degree).to(bench.device)
    return model, reference


def pmp_layer_medians(bench: LayerBench, name: str, layers: int, fanout: int, noise_std: float, repeats: int) -> tuple[float, float, int]:
    """Median seconds per forward + backward of ``name``'s layers and of the sparse GCN reference."""
    model, reference = layer_models(bench, name, layers, fanout)
    return bench.medians(model, reference, noise_std, repeats)


def layer_figures(
    dataset_path: Path | str = DEFAULT_DATASET,
    fanouts: Sequence[int] = (10, 10),
    batch_size: int = 256,
    dim: int = 64,
    batches: int = 30,
    repeats: int = 3,
    noise_std: float = 1.0,
    threads: int = 1,
    device: str = "cpu",
    quick: bool = False,
) -> list[PerfFigure]:
    """PMP-GCN and PMP-GIN forward + backward against a sparse-matrix GCN (ratio goal ≤ 1.3)."""
    fanout, layers = _single_fanout(fanouts), len(fanouts)
    if quick:
        batches = min(batches, 8)
    bench = layer_bench(dataset_path, fanouts, batch_size, dim, batches, device)
    command = COMMAND.format(source="layer")
    with torch_threads(threads):
        return [
            _layer_figure(bench, name, layers, fanout, noise_std, repeats, command, threads)
            for name in ("pmp-gcn", "pmp-gin")
        ]


def _layer_figure(
    bench: LayerBench, name: str, layers: int, fanout: int, noise_std: float, repeats: int, command: str, threads: int,
) -> PerfFigure:
    model, reference = layer_models(bench, name, layers, fanout)
    capped = bench.local[0].capped_degree
    pmp, gcn, steps = bench.medians(model, reference, noise_std, repeats)
    ratio = pmp / gcn
    passed = ratio <= LAYER_GOAL
    bound = ""
    if not passed:
        # what the time goes to, measured: the variants without spectral norm and without
        # noise (one pass each), the no-gradient pass alone, and the profile
        plain = _pmp_model(name, layers, fanout, bench.dim, capped, spectral_norm=False).to(bench.device)
        no_sn, gcn_a, _ = bench.medians(plain, reference, noise_std, 1)
        no_noise, gcn_b, _ = bench.medians(model, reference, 0.0, 1)
        mechanism = bench.mechanism_median(model, noise_std)
        bound = (
            f"Measured alongside (one pass each): without spectral normalisation {no_sn / gcn_a:.2f}x, without "
            f"noise {no_noise / gcn_b:.2f}x; the no-gradient pass alone (aggregate, noise and layer at every "
            f"frontier node, which PMP needs before the roots' chain with gradient) {mechanism * 1e3:.2f} ms of "
            f"the {pmp * 1e3:.2f} ms. The aggregation is one torch.sparse.mm per layer, as in the reference; the "
            f"rest is the method: Gaussian noise added at every frontier node and layer, two weights per layer (W_self and "
            f"W_agg), spectral normalisation of each (one power step per step for all {2 * layers}, batched), the "
            f"first layers run twice (without gradient over the frontier, with gradient over the roots), and the "
            f"normalisation of every layer's output. "
            f"torch.profiler, {name} over {len(bench.local)} subgraphs (forward + backward):\n"
            f"{bench.profile(model, noise_std)}"
        )
    blocks = bench.local[0].subgraph.blocks
    shape = ", ".join(f"{b.dst_count}x{b.src_nodes.numel()} ({b.edge_dst.numel()} messages)" for b in blocks)
    label = {"pmp-gcn": "PMP-GCN", "pmp-gin": "PMP-GIN"}[name]
    return PerfFigure(
        name=f"{label} layers forward + backward against a torch.sparse.mm GCN layer",
        value=round(ratio, 3), unit="x", direction="lower", goal=f"<= {LAYER_GOAL:g}", passed=passed,
        measured=(
            f"{pmp * 1e3:.2f} ms against {gcn * 1e3:.2f} ms per step (medians of {steps} steps each: "
            f"{len(bench.local)} Tolokers subgraphs x {repeats} passes, alternating); L = {len(blocks)}, "
            f"d = {bench.dim}, noise θ = {noise_std:g}, default extractor config (spectral norm on), h^(0) given "
            f"(the encoder, the same in both, is not timed); blocks of the first subgraph (dst x src): {shape}; "
            f"the reference's Â and what party A's prefetch builds for PMP while B computes (the blocks' messages, "
            f"CSR and β_uv; the input rows; the noise's N(0, 1) draws) built outside the timers (building PMP's: "
            f"{bench.ahead_median(model, noise_std) * 1e3:.2f} ms per step); {threads} torch thread(s), "
            f"{bench.device.type}"
        ),
        bound=bound, command=command,
    )


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
        figures += layer_figures(args.dataset, threads=args.threads, device=args.device, **extra)
    for figure in figures:
        verdict = "reported" if figure.passed is None else ("pass" if figure.passed else "FAIL")
        print(f"{figure.name}: {figure.value:g} {figure.unit}  goal {figure.goal or '-'}  {verdict}")
        print(f"  {figure.measured}")
        if figure.bound:
            print("  bound: " + figure.bound.replace("\n", "\n    "))


if __name__ == "__main__":
    main()
