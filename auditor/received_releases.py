"""Party B's record of one audited run, as the auditor reads it (``runs/<id>/received.npz``).

party_b/release_record.py writes it during the run; this is the only reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vesper.common.npz_files import read_npz
from vesper.party_b.release_record import SPLIT_CODES


@dataclass(frozen=True)
class ReceivedReleases:
    """``received.npz`` loaded: B's view of a finished run, as numpy arrays."""

    train_sum: np.ndarray  # (N, d, L) float64: sum over the training releases of each node
    train_count: np.ndarray  # (N,) how many training releases of each node B received
    eval_embedding: np.ndarray  # (N, d, L) the evaluation release (zeros where none)
    eval_seen: np.ndarray  # (N,) bool
    posterior_ids: np.ndarray  # (M,) evaluated nodes
    posterior_splits: np.ndarray  # (M,) SPLIT_CODES
    posteriors: np.ndarray  # (M, C) softmax of B's decoder

    @classmethod
    def load(cls, path: Path) -> ReceivedReleases:
        if not path.exists():
            raise FileNotFoundError(
                f"{path} does not exist: party B keeps what it received only for runs with audit.record_releases"
            )
        data = read_npz(path)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})

    @property
    def num_nodes(self) -> int:
        return int(self.train_count.shape[0])

    def mean_release(self) -> tuple[np.ndarray, np.ndarray]:
        """Per node the mean of every release B received (training and evaluation), and a
        mask of the nodes B received at least once."""
        total = self.train_sum + self.eval_embedding * self.eval_seen[:, None, None]
        count = self.train_count + self.eval_seen
        received = count > 0
        mean = np.zeros_like(total)
        mean[received] = total[received] / count[received, None, None]
        return mean, received

    def split_ids(self, split: str) -> np.ndarray:
        return self.posterior_ids[self.posterior_splits == SPLIT_CODES[split]]
