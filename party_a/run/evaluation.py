"""The evaluation pass "eval-0": chunks of B's validation and test nodes (each a root once),
each charged, then sent; B answers with its metrics. Under PATE the same pass first carries
A's frozen embeddings of B's teachers and queries (``collect``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from vesper.common.config import Metric
from vesper.common.wire import node_mask, validate_node_ids
from vesper.party_a.extractors.base import Extractor, RootPlan
from vesper.party_a.peers import EvaluationStream
from vesper.party_a.run.context import RunContext
from vesper.party_a.run.progress import ProgressEvent
from vesper.party_a.run.release import Release
from vesper.proto.v1 import label_party_pb2 as lp_pb

Parts = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Scores:
    """B's answer: the kept model's metric per split and, with an edge-free path, the head B
    kept and every head's metrics (keyed ``<split>@<head>``)."""

    metrics: dict[str, Metric]
    head: str = ""
    head_metrics: dict[str, Metric] = field(default_factory=dict)
    head_errors: dict[str, Metric] = field(default_factory=dict)  # "val@<head>": SE of its lead (party_b.head_choice)


@torch.no_grad()
def evaluate(
    ctx: RunContext, roots: RootPlan, release: Release, extractor: Extractor, first_index: int = 0,
    parts_of: Callable[[RootPlan, Parts], Parts] = lambda roots, parts: parts,
) -> Scores:
    """B's metrics of the trained model on its validation and test nodes. ``parts_of``: the
    audit hooks' say in what the pass releases (TFTS adds the members)."""
    parts = parts_of(roots, [("val", roots.val_ids), ("test", roots.test_ids)])
    result, _ = evaluation_pass(ctx, ctx.label_party.evaluation(), parts, release, extractor, first_index, "eval", "evaluating")
    return Scores(
        {m.split: Metric(name=m.name, value=m.value) for m in result.metrics}, result.decoder_head,
        {m.split: Metric(name=m.name, value=m.value) for m in result.head_metrics},
        {m.split: Metric(name=m.name, value=m.value) for m in result.head_errors},
    )


@torch.no_grad()
def collect(
    ctx: RunContext, roots: RootPlan, release: Release, extractor: Extractor, num_nodes: int,
) -> tuple[RootPlan, int, str]:
    """pate: A's frozen embeddings of B's labelled nodes and of the queries, released in
    the evaluation pass; B answers with the answered queries, the student's roots."""
    reply, index = evaluation_pass(
        ctx, ctx.label_party.collection(), (("train", roots.teacher_ids), ("query", roots.train_ids)), release,
        extractor, 0, "prepare", "embeddings for B's teachers",
    )
    answered = (
        validate_node_ids(
            list(reply.answered_ids), name="party B's answered queries",
            allowed=node_mask(roots.train_ids, num_nodes), num_nodes=num_nodes,
        )
        if reply.answered_ids else torch.empty(0, dtype=torch.int64)
    )
    student = dataclasses.replace(
        roots, train_ids=answered, steps_per_epoch=math.ceil(answered.numel() / ctx.config.batch_size),
    )
    ctx.report(ProgressEvent("prepare", message=reply.label_note, epsilon_spent=ctx.charger.epsilon_spent))
    return student, index, reply.label_note


def evaluation_pass(
    ctx: RunContext, stream: EvaluationStream, parts: Iterable[tuple[str, torch.Tensor]], release: Release,
    extractor: Extractor, first_index: int, phase: str, label: str,
) -> tuple[object, int]:
    """Chunks of the evaluation pass "eval-0" (each node a root once), each charged, then
    sent; returns B's one answer and the next chunk index."""
    extractor.train(False)
    index = first_index
    try:
        for split, ids in parts:
            for chunk in ids.split(ctx.config.eval_chunk):
                ctx.stop_if_cancelled()
                ctx.report(ProgressEvent(phase, message=f"{label} ({split})", epsilon_spent=ctx.charger.epsilon_spent))
                _, message = ctx.charger.charged_release(
                    lambda nodes: extractor.release(nodes, "eval"), chunk, release, "eval-0", "eval", index
                )
                index += 1
                stream.send(lp_pb.EvalChunk(
                    run_id=ctx.run_id, eval_id=0, split=split, node_ids=chunk.tolist(), embeddings=message,
                ))
        return stream.result(), index
    except BaseException:
        stream.cancel()
        raise
