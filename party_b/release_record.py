"""What party B received in one run, kept for the audit (docs/audit.md).

B is the adversary of A's edges: everything here is B's own view, nothing A did not send.
For an audited run (``RunConfig.audit.record_releases``) B keeps

* per node, the **sum and count of the training releases** it received (every epoch
  releases each training root once; the sum is what a linear attack needs, and keeping
  all releases would cost epochs x N x d x L);
* per node, the **evaluation release** (one per node, in the evaluation pass);
* per evaluated node, the decoder's **posterior** (softmax of its logits) and its split:
  what the membership attack queries.

Written once, when the run finishes, to ``runs/<id>/received.npz`` in B's workdir; the
auditor reads it (auditor/received_releases.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


class ReleaseRecord:
    """Accumulates B's view of one run. Not thread-safe: the session's lock guards it."""

    def __init__(self, num_nodes: int, dim: int, layers: int) -> None:
        self.train_sum = torch.zeros(num_nodes, dim, layers, dtype=torch.float64)
        self.train_count = torch.zeros(num_nodes, dtype=torch.int64)
        self.eval_embedding = torch.zeros(num_nodes, dim, layers, dtype=torch.float32)
        self.eval_seen = torch.zeros(num_nodes, dtype=torch.bool)
        self.posterior_ids: list[torch.Tensor] = []
        self.posterior_splits: list[torch.Tensor] = []
        self.posteriors: list[torch.Tensor] = []

    def add_training(self, node_ids: torch.Tensor, embeddings: torch.Tensor) -> None:
        ids = node_ids.cpu()
        self.train_sum.index_add_(0, ids, embeddings.detach().cpu().to(torch.float64))
        self.train_count.index_add_(0, ids, torch.ones_like(ids))

    def add_evaluation(self, split: str, node_ids: torch.Tensor, embeddings: torch.Tensor, logits: torch.Tensor) -> None:
        ids = node_ids.cpu()
        self.eval_embedding[ids] = embeddings.detach().cpu().float()
        self.eval_seen[ids] = True
        self.posterior_ids.append(ids)
        self.posterior_splits.append(torch.full_like(ids, SPLIT_CODES[split]))
        self.posteriors.append(torch.softmax(logits.detach().cpu().float(), dim=-1))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        width = self.posteriors[0].shape[-1] if self.posteriors else 0
        np.savez_compressed(
            path,
            train_sum=self.train_sum.numpy(),
            train_count=self.train_count.numpy(),
            eval_embedding=self.eval_embedding.numpy(),
            eval_seen=self.eval_seen.numpy(),
            posterior_ids=torch.cat(self.posterior_ids).numpy() if self.posterior_ids else np.zeros(0, np.int64),
            posterior_splits=torch.cat(self.posterior_splits).numpy() if self.posterior_splits else np.zeros(0, np.int64),
            posteriors=torch.cat(self.posteriors).numpy() if self.posteriors else np.zeros((0, width), np.float32),
        )
