"""Setting a run up with party B: the SetupRun request, and the roots B's split gives A."""

from __future__ import annotations

import dataclasses
import math

import torch

from vesper.common.config import RunConfig
from vesper.common.wire import dtype_to_proto, validate_node_ids
from vesper.party_a.extractors.base import RootPlan
from vesper.party_a.membership_audit import tfts_chunk
from vesper.proto.v1 import label_party_pb2 as lp_pb


def setup_request(
    config: RunConfig, run_id: str, session_id: str, layers: int, delta: float, status_url: str,
    resume: bool, resume_step: int, edge_free_layers: int = 0,
) -> lp_pb.SetupRunRequest:
    """B's session ``session_id`` of run ``run_id`` (the run itself, or one of its stages); the last
    ``edge_free_layers`` of its ``layers`` slices are the edge-free path's (party_a.extractors.edge_free_path)."""
    cfg = config
    return lp_pb.SetupRunRequest(
        run_id=session_id,
        dataset=cfg.dataset,
        decoder=lp_pb.DecoderSpec(kind=cfg.decoder.kind, hidden_dim=cfg.decoder.hidden_dim, dropout=cfg.decoder.dropout),
        optimizer=lp_pb.OptimizerSpec(name=cfg.optimizer.name, lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay),
        seed=cfg.seed,
        budget=lp_pb.Budget(epsilon=cfg.privacy.epsilon, delta=delta, accounting=cfg.privacy.accounting, status_url=status_url),
        embedding_dim=cfg.extractor.dim,
        num_layers=layers,
        wire_dtype=dtype_to_proto(cfg.wire_dtype),
        split_seed=cfg.split_seed,
        label_privacy_json="" if cfg.label_privacy.mode == "none" else cfg.label_privacy.model_dump_json(),
        label_run_id=run_id,
        record_releases=cfg.audit.record_releases and session_id == run_id,
        membership_audit=cfg.audit.membership and session_id == run_id,
        resume=resume,
        resume_step=resume_step,
        edge_free_layers=edge_free_layers,
    )


def _split_ids(reply: lp_pb.SetupRunReply, num_nodes: int, pate: bool) -> dict[str, torch.Tensor]:
    """B's split, each id checked against A's graph."""
    if reply.num_nodes != num_nodes:
        raise ValueError(
            f"node ids are not aligned: party B's labels cover {reply.num_nodes} nodes, "
            f"party A's graph has {num_nodes} (for an aligned dataset: its shared index)"
        )
    ids = {}
    for name in ("train", "val", "test", "query"):
        values = list(getattr(reply, f"{name}_ids"))
        if not values and name in ("train", "test"):
            raise ValueError(f"party B's split has no {name} nodes")
        ids[name] = (
            validate_node_ids(values, name=f"party B's {name} split", num_nodes=num_nodes)
            if values else torch.empty(0, dtype=torch.int64)
        )
    if pate and not ids["query"].numel():
        raise ValueError("label privacy pate: party B named no query nodes")
    return ids


def root_plan(config: RunConfig, reply: lp_pb.SetupRunReply, num_nodes: int) -> RootPlan:
    """The run's roots: what it trains on, what it evaluates, and how many chunks the
    evaluation pass has (each node a root once per pass, which both charging forms need)."""
    pate = config.label_privacy.mode == "pate"
    ids = _split_ids(reply, num_nodes, pate)
    # under pate the teachers' nodes and the queries are released in the evaluation pass
    # too (so does TFTS: the training nodes, for the membership attack)
    tfts = config.audit.membership
    evaluated = torch.cat([
        ids["val"], ids["test"], *((ids["train"], ids["query"]) if pate else ()), *((ids["train"],) if tfts else ()),
    ])
    if torch.unique(evaluated).numel() != evaluated.numel():
        what = "splits (val, test, training nodes and queries)" if pate else "val and test splits"
        what = "splits (train, val and test)" if tfts else what
        raise ValueError(f"party B's {what} overlap: a node would be released twice in one pass")
    chunk = config.eval_chunk
    chunks = sum(math.ceil(ids[name].numel() / chunk) for name in ("val", "test"))
    if pate:
        chunks += math.ceil(ids["train"].numel() / chunk) + math.ceil(ids["query"].numel() / chunk)
    train = ids["query"] if pate else ids["train"]
    roots = RootPlan(
        train_ids=train,
        val_ids=ids["val"],
        test_ids=ids["test"],
        steps_per_epoch=math.ceil(train.numel() / config.batch_size),
        eval_chunks=chunks,
        teacher_ids=ids["train"] if pate else torch.empty(0, dtype=torch.int64),
        predict_chunks=math.ceil(num_nodes / chunk),  # a prediction pass: every node B may name, once
    )
    if tfts:
        train_chunks = math.ceil(train.numel() / tfts_chunk(roots, chunk))
        roots = dataclasses.replace(roots, eval_chunks=chunks + train_chunks)
    return roots
