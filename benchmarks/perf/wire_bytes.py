"""Bytes on the wire per training step, float32 against bfloat16, and whether bfloat16 moves
the test metric (issue #9, item 1d).

**Bytes**: the messages of one training step exactly as party A and party B build them
(``TrainStep``: run id, step, the batch's node ids, the B x d x L release; ``TrainStepReply``:
the gradient of the same shape and dtype, the loss), serialised with protobuf, for every
step of one epoch of B's training roots in the run's root order; plus gRPC's framing: the
5-byte length prefix of each message and the 9-byte header of each HTTP/2 DATA frame (at
most 16 KiB each, HTTP/2's default). TCP/IP headers are not counted. Reported per step
(mean over the epoch) as the whole messages and as the tensor data alone; the goal
(bfloat16 ≤ 0.5 × float32) is on the tensor data, which is all that the dtype changes.

**Metric**: the same run (PMP-GCN on Cora at ε = 8, visible-batch) with each wire dtype over
``seeds`` seeds, in one process (:class:`InProcessCluster`: the same services and messages,
no network). Each seed uses the same secrets for both dtypes (A's ``secret_seed`` = seed),
so the dtype is the only difference within a pair. "Does not move beyond seed noise": the
difference of the means is within the seeds' spread (the larger of the two standard
deviations) and Welch's t-test does not reject equal means at 5 %.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

import torch

from vesper.benchmarks.perf.figures import PerfFigure

GRPC_MESSAGE_PREFIX = 5  # compressed flag + 4-byte length (gRPC over HTTP/2)
HTTP2_FRAME_HEADER = 9
HTTP2_MAX_FRAME = 16_384  # SETTINGS_MAX_FRAME_SIZE's default
COMMAND = "vesper bench perf --only wire"
DTYPES = ("float32", "bfloat16")


def framed(message_bytes: int) -> int:
    """Bytes of one gRPC message on an HTTP/2 stream: its prefix and DATA frame headers."""
    payload = message_bytes + GRPC_MESSAGE_PREFIX
    return payload + HTTP2_FRAME_HEADER * max(1, math.ceil(payload / HTTP2_MAX_FRAME))


def step_bytes(node_ids: list[int], step: int, dim: int, layers: int, dtype: str, run_id: str = "0123456789ab") -> tuple[int, int]:
    """(bytes on the wire, tensor data bytes) of one training step: A's TrainStep and B's reply."""
    from vesper.common.wire import encode_tensor
    from vesper.proto.v1 import label_party_pb2 as lp_pb

    generator = torch.Generator().manual_seed(step)
    shape = (len(node_ids), dim, layers)
    embeddings = encode_tensor(torch.randn(shape, generator=generator), dtype)
    gradient = encode_tensor(torch.randn(shape, generator=generator) * 1e-3, dtype)
    request = lp_pb.TrainStep(run_id=run_id, step=step, node_ids=node_ids, embeddings=embeddings, checkpoint=False)
    reply = lp_pb.TrainStepReply(run_id=run_id, step=step, gradient=gradient, loss=1.2345)
    wire = framed(request.ByteSize()) + framed(reply.ByteSize())
    return wire, len(embeddings.data) + len(gradient.data)


def epoch_batches(dataset: str, batch_size: int, seed: int = 0, epoch: int = 0) -> list[list[int]]:
    """B's training roots of ``dataset`` in the trainer's root order of epoch ``epoch``."""
    from vesper.common.dataset_files import resolve_dataset
    from vesper.party_a.extractors.base import shuffled_batches
    from vesper.party_b.label_data import load_labels

    store = load_labels(resolve_dataset(dataset), 0)
    train = torch.from_numpy(store.split.train)
    order = torch.Generator().manual_seed(seed)
    batches: list[torch.Tensor] = []
    for _ in range(epoch + 1):
        batches = shuffled_batches(train, batch_size, order)
    return [b.tolist() for b in batches if b.numel()]


def bytes_per_step(dataset: str = "cora", batch_size: int = 256, dim: int = 64, layers: int = 1) -> dict[str, tuple[float, float]]:
    """dtype -> (mean bytes on the wire per step, mean tensor bytes per step) over one epoch."""
    batches = epoch_batches(dataset, batch_size, epoch=1)
    first_step = len(batches)  # the second epoch's steps: step numbers as a run has them
    result = {}
    for dtype in DTYPES:
        sizes = [step_bytes(ids, first_step + i, dim, layers, dtype) for i, ids in enumerate(batches)]
        result[dtype] = (statistics.fmean(s[0] for s in sizes), statistics.fmean(s[1] for s in sizes))
    return result


# -- the metric with each dtype ---------------------------------------------------------------
def metric_runs(seeds: int, epochs: int, workdir: Path, epsilon: float = 8.0, threads: int = 1) -> dict[str, list[float]]:
    """dtype -> the test metric of each seed, every run in one process through the services' code."""
    from vesper.benchmarks.perf.throughput import pinned_threads
    from vesper.common.config import RunConfig
    from vesper.coordinator.in_process import InProcessCluster

    metrics: dict[str, list[float]] = {dtype: [] for dtype in DTYPES}
    with pinned_threads(threads):
        for seed in range(seeds):
            # the same secrets for both dtypes: the pair differs only in what the wire rounds
            with InProcessCluster(workdir / f"seed-{seed}", party_a={"secret_seed": seed}, party_b={"secret_seed": seed}) as cluster:
                for dtype in DTYPES:
                    config = RunConfig.model_validate({
                        "dataset": "cora", "epochs": epochs, "seed": seed, "wire_dtype": dtype,
                        "privacy": {"epsilon": epsilon}, "extractor": {"name": "pmp-gcn"},
                    })
                    summary = cluster.drive(config)
                    if summary.status != "completed" or summary.test_metric is None:
                        raise RuntimeError(f"{dtype} seed {seed}: the run ended {summary.status}: {summary.message}")
                    metrics[dtype].append(summary.test_metric.value)
    return metrics


def welch_p_value(left: list[float], right: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (1.0 when both samples are constant and equal)."""
    from scipy import stats

    if statistics.pstdev(left) == 0 and statistics.pstdev(right) == 0:
        return 1.0 if statistics.fmean(left) == statistics.fmean(right) else 0.0
    return float(stats.ttest_ind(left, right, equal_var=False).pvalue)


def paired_p_value(left: list[float], right: list[float]) -> float:
    """Two-sided p-value of the paired t-test (the same secrets per seed; 1.0 for no difference at all)."""
    from scipy import stats

    differences = [b - a for a, b in zip(left, right, strict=True)]
    if statistics.pstdev(differences) == 0:
        return 1.0 if differences[0] == 0 else 0.0
    return float(stats.ttest_rel(left, right).pvalue)


def within_seed_noise(float32: list[float], bfloat16: list[float]) -> tuple[bool, float, float, float]:
    """(verdict, difference of means, the seeds' spread, Welch p) of the two metric samples."""
    difference = statistics.fmean(bfloat16) - statistics.fmean(float32)
    spread = max(statistics.stdev(float32), statistics.stdev(bfloat16))
    p_value = welch_p_value(float32, bfloat16)
    return abs(difference) <= spread and p_value >= 0.05, difference, spread, p_value


def _mean_std(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def wire_figures(
    dataset: str = "cora", seeds: int = 5, epochs: int = 50, workdir: Path | None = None, quick: bool = False,
) -> list[PerfFigure]:
    """Bytes per step (tensor data and whole messages) and the metric at ε = 8 with each dtype."""
    if quick:
        epochs, seeds = min(epochs, 5), min(seeds, 3)
    sizes = bytes_per_step(dataset)
    (wire32, tensor32), (wire16, tensor16) = sizes["float32"], sizes["bfloat16"]
    tensor_ratio, wire_ratio = tensor16 / tensor32, wire16 / wire32
    figures = [
        PerfFigure(
            name="wire bytes per step, bfloat16 against float32 (tensor data)", value=round(tensor_ratio, 4), unit="x",
            measured=(
                f"{tensor16:,.0f} vs {tensor32:,.0f} bytes of release + gradient data per step (mean over one epoch "
                f"of {dataset}'s training roots, batch 256, d = 64, L = 1)"
            ),
            goal="<= 0.5", passed=tensor_ratio <= 0.5, direction="lower", command=COMMAND,
        ),
        PerfFigure(
            name="wire bytes per step, bfloat16 against float32 (whole messages)", value=round(wire_ratio, 4), unit="x",
            measured=(
                f"{wire16:,.0f} vs {wire32:,.0f} bytes per step: TrainStep + TrainStepReply serialised, gRPC's 5-byte "
                "prefixes and HTTP/2 DATA frame headers; the node ids (varints) and the rest do not shrink"
            ),
            direction="lower", command=COMMAND,
        ),
    ]
    with tempfile.TemporaryDirectory(prefix="vesper-perf-wire-") as scratch:
        metrics = metric_runs(seeds, epochs, Path(workdir) if workdir is not None else Path(scratch))
    f32, bf16 = metrics["float32"], metrics["bfloat16"]
    passed, difference, spread, p_value = within_seed_noise(f32, bf16)
    paired = [b - f for f, b in zip(f32, bf16, strict=True)]
    paired_p = paired_p_value(f32, bf16)
    figures.append(PerfFigure(
        name="test accuracy at ε = 8, bfloat16 minus float32 (Cora, PMP-GCN)", value=round(difference, 4), unit="",
        measured=(
            f"float32 {_mean_std(f32)} ({', '.join(f'{v:.4f}' for v in f32)}); bfloat16 {_mean_std(bf16)} "
            f"({', '.join(f'{v:.4f}' for v in bf16)}); seeds 0-{seeds - 1}, {epochs} epochs, in one process; "
            f"difference of means {difference:+.4f} against the seeds' spread {spread:.4f}; Welch p = {p_value:.3f}; "
            f"paired differences (same secrets per seed) {', '.join(f'{d:+.4f}' for d in paired)}, "
            f"paired t-test p = {paired_p:.3f}"
        ),
        goal="within seed noise (|difference| <= the larger std, Welch p >= 0.05)", passed=passed, direction="none",
        bound="" if passed else (
            f"bfloat16 moved the mean by {difference:+.4f}, beyond the seeds' spread {spread:.4f} or significant "
            f"(Welch p = {p_value:.3f})"
        ),
        command=f"{COMMAND} (seeds {seeds}, {epochs} epochs)",
    ))
    return figures
