"""DGL 2.1's neighbour sampler timed on a graph vesper hands it: the peer of the sampler figure.

Run by ``vesper bench perf --peer-env PATH`` with the peer environment's own python (DGL 2.1
and its torch 2.1, built by ``make bench-peer``), never imported by vesper: it needs only
numpy, torch and dgl, which is why it imports nothing of vesper's.

    PATH/bin/python dgl_peer.py --graph GRAPH.npz --fanouts 10 10 --batch 256 --repeats 5

GRAPH.npz holds ``indptr``, ``indices`` (vesper's CSR, symmetric) and ``roots``. Timed: one
epoch of ``dgl.dataloading.NeighborSampler`` + ``DataLoader`` over the roots, shuffled, in
batches, as DGL's examples train (median of ``repeats`` after one warm-up epoch). Prints one
JSON object: the seconds of each epoch, the batch and input-node counts, the versions.
"""

from __future__ import annotations

import argparse
import json
import time

import dgl
import numpy as np
import torch


def epoch_seconds(loader: dgl.dataloading.DataLoader) -> tuple[float, int, int]:
    """One pass over the loader: seconds, batches, input nodes summed over batches."""
    started = time.perf_counter()
    batches = inputs = 0
    for input_nodes, _output_nodes, _blocks in loader:
        batches += 1
        inputs += int(input_nodes.numel())
    return time.perf_counter() - started, batches, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--fanouts", type=int, nargs="+", default=[10, 10])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = np.load(args.graph)
    indptr = torch.from_numpy(data["indptr"].astype(np.int64))
    indices = torch.from_numpy(data["indices"].astype(np.int64))
    roots = torch.from_numpy(data["roots"].astype(np.int64))
    graph = dgl.graph(("csr", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=indptr.numel() - 1)
    sampler = dgl.dataloading.NeighborSampler(args.fanouts)
    loader = dgl.dataloading.DataLoader(
        graph, roots, sampler, batch_size=args.batch, shuffle=True, drop_last=False, num_workers=0
    )
    epoch_seconds(loader)  # warm-up
    seconds, batches, inputs = [], 0, 0
    for _ in range(args.repeats):
        took, batches, inputs = epoch_seconds(loader)
        seconds.append(took)
    print(json.dumps({
        "seconds": seconds, "batches": batches, "input_nodes": inputs, "edges": int(graph.num_edges()),
        "dgl": dgl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
