"""``python -m vesper.benchmarks.perf.layer_profile DATASET [--device cuda]``: where a PMP-GCN
layer step spends its time, beside the sparse GCN reference (the GPU check's layer figure,
``vesper bench device``, says how long; this says why).

The steps are ``vesper bench device``'s: PMP-GCN's two layers, forward + backward, over
subgraphs sampled as in training (fanout [10, 10], batch 256, d = 64), after a warm-up pass;
torch's profiler counts the kernel launches and the host-device copies or syncs per step and
prints the operators by self time on the host and on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import typer
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from vesper.benchmarks.perf.layer_figure import LayerBench, layer_bench, layer_models

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")


def profiled(bench: LayerBench, name: str, work) -> str:  # noqa: ANN001 (a no-argument callable)
    """One profiled pass of ``work`` over the bench's subgraphs: a summary line, then the tables."""
    cuda = bench.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        work()
        if cuda:
            torch.cuda.synchronize(bench.device)
    events = prof.key_averages()
    steps = len(bench.local)
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    syncs = sum(e.count for e in events if "Synchronize" in e.key or e.key.startswith("cudaMemcpy"))
    host_ms = sum(e.self_cpu_time_total for e in events) / 1000 / steps
    # the device's own events (the kernels), as the profiler's table sums them: an operator's
    # self device time repeats its kernels'
    device_ms = sum(
        e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    ) / 1000 / steps
    lines = [
        f"== {name} on {bench.device.type}: per step {launches / steps:.0f} kernel launches, "
        f"{syncs / steps:.0f} copies or syncs, host {host_ms:.2f} ms (profiled), device {device_ms:.3f} ms",
        events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50),
    ]
    if cuda:
        lines.append(events.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=50))
    return "\n".join(lines)


def layer_profile(dataset: Path, device: str, batches: int) -> str:
    bench = layer_bench(dataset, (10, 10), 256, 64, batches, device)
    model, reference = layer_models(bench, "pmp-gcn", 2, 10)

    def ahead() -> Callable[[], None]:
        """The steps, with what party A's prefetch builds (messages, input rows, noise draws) built
        now, outside the profile, and used once: a step consumes its noise draws."""
        leaves = [bench.leaf(item) for item in bench.local]
        built = [bench.ahead(model, item, h0, 1.0) for item, h0 in zip(bench.local, leaves, strict=True)]

        def pmp() -> None:
            for item, h0, parts in zip(bench.local, leaves, built, strict=True):
                bench.pmp_step(model, item, h0, 1.0, parts)

        return pmp

    def gcn() -> None:
        for item in bench.local:
            bench.gcn_step(reference, item, bench.leaf(item))

    ahead()()  # warm-up: the first kernels, the caching allocator
    gcn()
    return "\n\n".join([profiled(bench, "pmp-gcn", ahead()), profiled(bench, "sparse GCN", gcn)])


def main(
    dataset: Path = typer.Argument(..., help="A graph .npz (e.g. vesper data synth's)."),
    device: str = typer.Option("cuda" if torch.cuda.is_available() else "cpu", "--device"),
    batches: int = typer.Option(10, "--batches", min=1, help="Subgraphs profiled."),
) -> None:
    """Where a PMP-GCN layer step spends its time, beside the sparse GCN reference."""
    print(layer_profile(dataset, device, batches))


if __name__ == "__main__":
    typer.run(main)
