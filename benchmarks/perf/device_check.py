"""`vesper bench device`: the GPU check's figures (issue #25, item 5), the CPU against an
accelerator, both measured in this one run.

Two pieces of party A's work, each timed on the CPU and on ``--device`` in this process and
printed side by side with the ratio:

1. **PMP-GCN layers, forward + backward** on subgraphs sampled from the graph as in training
   (fanout [10, 10], batch 256, d = 64), exactly as ``vesper bench perf --only layer`` times
   them (layer_figure.LayerBench: h^(0) given, the blocks' messages built outside the timer);
   the median step.
2. **A training step in one process** (throughput.OneProcess): A's PMP-GCN extractor samples,
   encodes and releases a batch, B's session decodes it and returns the gradient, A's
   optimiser steps; seconds per step over ``--steps`` steps after three warm-up steps.

The graph is the bundled Cora unless ``--dataset`` names another (the GPU check makes a
dense synthetic one, 100,000 nodes and 1M edges, with ``vesper data synth``). With
``--device cpu`` (the check's dry run) the CPU is timed twice: the ratio then says only
that the harness ran end to end. ``--junit`` adds the outcome of the CUDA-marked tests
(pytest's JUnit XML) to the one table the check prints.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import typer
from rich.console import Console
from rich.table import Table

from vesper.benchmarks.perf.kernels import torch_threads
from vesper.benchmarks.perf.layer_figure import layer_bench, pmp_layer_medians
from vesper.benchmarks.perf.throughput import OneProcess, ThroughputOptions

FANOUTS = (10, 10)
BATCH = 256
DIM = 64


@dataclass(frozen=True)
class DeviceFigure:
    """One piece of work, timed on the CPU and on the device."""

    name: str
    cpu_ms: float
    device_ms: float
    device: str
    detail: str

    @property
    def speedup(self) -> float:
        return self.cpu_ms / self.device_ms


@dataclass(frozen=True)
class CudaTests:
    """What pytest's JUnit XML says of the CUDA-marked tests."""

    passed: int
    failed: int
    skipped: int
    failures: list[str]

    @classmethod
    def read(cls, path: Path) -> CudaTests:
        root = ET.parse(path).getroot()
        cases = list(root.iter("testcase"))
        failures = [
            f"{case.get('classname')}::{case.get('name')}" for case in cases
            if case.find("failure") is not None or case.find("error") is not None
        ]
        skipped = sum(case.find("skipped") is not None for case in cases)
        return cls(len(cases) - len(failures) - skipped, len(failures), skipped, failures)


def layer_ms(dataset: Path, device: str, batches: int, repeats: int) -> tuple[float, str]:
    """Median milliseconds of PMP-GCN's layers, forward + backward, on ``device``."""
    bench = layer_bench(dataset, FANOUTS, BATCH, DIM, batches, device)
    pmp, gcn, steps = pmp_layer_medians(bench, "pmp-gcn", len(FANOUTS), FANOUTS[0], 1.0, repeats)
    return pmp * 1e3, f"{steps} steps; torch.sparse.mm GCN {gcn * 1e3:.2f} ms"


def step_ms(dataset: Path, device: str, steps: int, workdir: Path) -> tuple[float, str]:
    """Milliseconds per training step of A and B in one process, on ``device``, in the steady state."""
    options = ThroughputOptions(
        dataset=str(dataset), extractor="pmp-gcn", epsilon=8.0, epochs=1_000, batch_size=BATCH,
        layers=len(FANOUTS), fanout=FANOUTS[0], warmup_steps=3, noise_multiplier=1.0,  # z fixed: nothing calibrated
    )
    loop = OneProcess(options, dataset, workdir, charged=False, device=device)
    try:
        rate = loop.run(options.warmup_steps, max_steps=options.warmup_steps + steps)
    finally:
        loop.close()
    return 1e3 / rate.steps_per_second, f"{rate.timed_steps} steps after {options.warmup_steps} warm-up"


def measure(dataset: Path, device: str, batches: int, repeats: int, steps: int, workdir: Path) -> list[DeviceFigure]:
    figures = []
    for name, work in (
        ("PMP-GCN layers, forward + backward", lambda where: layer_ms(dataset, where, batches, repeats)),
        ("training step, A and B in one process", lambda where: step_ms(dataset, where, steps, workdir)),
    ):
        cpu, cpu_detail = work("cpu")
        there, detail = work(device)
        figures.append(DeviceFigure(name, cpu, there, device, f"cpu: {cpu_detail}. {device}: {detail}"))
    return figures


def table(figures: list[DeviceFigure], tests: CudaTests | None, seconds: float, what: str) -> Table:
    device = figures[0].device if figures else "device"
    out = Table(title=f"vesper GPU check: {what}", show_lines=False)
    for column in ("check", "cpu", device, f"cpu / {device}", "notes"):
        out.add_column(column)
    if tests is not None:
        verdict = "passed" if not tests.failed and tests.passed else ("FAILED" if tests.failed else "none ran")
        notes = "; ".join(tests.failures) or (f"{tests.skipped} skipped (no CUDA device)" if tests.skipped else "")
        out.add_row("CUDA-marked tests", "", f"{tests.passed} passed, {tests.failed} failed", verdict, notes)
    for figure in figures:
        out.add_row(
            figure.name, f"{figure.cpu_ms:.2f} ms", f"{figure.device_ms:.2f} ms", f"{figure.speedup:.2f}x", figure.detail,
        )
    out.caption = f"measured in this one run, {seconds:.0f} s"
    return out


def device_command(
    device: str = typer.Option("cuda", "--device", help="The accelerator to time against the CPU (cpu: a dry run)."),
    dataset: Path = typer.Option(None, "--dataset", help="An .npz with labels (default: the bundled Cora)."),
    batches: int = typer.Option(20, "--batches", min=2, help="Subgraphs timed for the layer figure."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Passes over them."),
    steps: int = typer.Option(30, "--steps", min=2, help="Timed steps of the one-process training run."),
    threads: int = typer.Option(0, "--threads", min=0, help="CPU torch threads (0: all cores)."),
    junit: Path = typer.Option(None, "--junit", help="pytest's JUnit XML of the CUDA-marked tests, shown in the table."),
    out: Path = typer.Option(None, "--out", help="Also write the figures here as JSON."),
    workdir: Path = typer.Option(Path(".vesper/device-check"), "--workdir", help="Scratch space."),
) -> None:
    """Time PMP-GCN's layers and a training step on the CPU and on an accelerator, in one run."""
    console = Console(width=150)
    if device != "cpu" and not torch.cuda.is_available():
        console.print(f"[red]{device} is not available to this torch ({torch.__version__}, CUDA build "
                      f"{torch.version.cuda}): run with --device cpu for the dry run[/red]")
        raise typer.Exit(3)
    if dataset is None:
        dataset = Path(__file__).resolve().parents[2] / "common" / "bundled" / "cora.npz"
        if not dataset.is_file():  # installed from a wheel: the package's own copy
            import vesper.common

            dataset = Path(vesper.common.__file__).parent / "bundled" / "cora.npz"
    started = time.monotonic()
    with torch_threads(threads or torch.get_num_threads()):
        figures = measure(dataset, device, batches, repeats, steps, workdir)
    tests = CudaTests.read(junit) if junit is not None and junit.is_file() else None
    what = f"{dataset.name}, cpu against {device}" + (" (dry run: the CPU twice)" if device == "cpu" else "")
    if device.startswith("cuda"):
        what += f" ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"
    console.print(table(figures, tests, time.monotonic() - started, what))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "device": device, "dataset": str(dataset), "torch": torch.__version__,
            "figures": [asdict(f) | {"speedup": f.speedup} for f in figures],
            "tests": None if tests is None else asdict(tests),
        }, indent=2) + "\n")
    if tests is not None and tests.failed:
        raise typer.Exit(1)
