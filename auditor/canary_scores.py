"""Scoring the canaries of an audited run and the ε lower bound the guesses give (docs/audit-canaries.md).

Party A drew and planted the canaries (party_a/canaries.py) and, for per-step PMP runs,
accumulated per-release white-box statistics of their endpoints (party_a/canary_statistics.py);
party B kept what it received (party_b/release_record.py). Only the auditor reads both:

* ``audit_canaries``: B's own view, its similarity score of each candidate pair
  (auditor.edge_inference.pair_scores);
* ``audit_canaries_white_box``: the mechanism statistic (A's noisy aggregates against its
  noiseless references, the Neyman-Pearson test) and the release statistic (B's sums of the
  releases against A's references), party_a/canary_statistics.py's module docstring.

Each score is guessed and bounded by the one-run theorem [SNJ23, Thm. 3.1]
(auditor/one_run_bound.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vesper.auditor.edge_inference import pair_scores
from vesper.auditor.one_run_bound import OneRunAudit, canary_audit
from vesper.auditor.received_releases import ReceivedReleases
from vesper.common.npz_files import read_npz
from vesper.party_a.canaries import CanaryDraw
from vesper.party_a.canary_statistics import STATISTICS_FILE

PAIR_SCORER = "B's view: auditor.edge_inference.pair_scores"
MECHANISM_SCORER = "white-box: log-likelihood ratio of every noisy aggregate of the endpoints (A's view)"
RELEASE_SCORER = "white-box: B's sums of every release of the endpoints against A's noiseless references"


def audit_canaries(draw: CanaryDraw, received: ReceivedReleases, delta: float, confidence: float) -> OneRunAudit:
    """B's guesses about the canaries from what it received, and the ε lower bound they give."""
    if received.num_nodes <= int(draw.pairs.max(initial=-1)):
        raise ValueError(f"the canaries name node {int(draw.pairs.max())}, but party B received ids of {received.num_nodes}")
    return canary_audit(pair_scores(received, draw.pairs), draw.included, delta, confidence, PAIR_SCORER)


def load_statistics(run_dir: Path) -> dict[str, np.ndarray]:
    path = run_dir / STATISTICS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: party A keeps per-release canary statistics only for audited runs of "
            "pmp-gin/pmp-gcn with L = 1, no degree projection and no edge subsampling"
        )
    return read_npz(path)


def _per_pair(draw: CanaryDraw, endpoints: np.ndarray, per_endpoint: np.ndarray) -> np.ndarray:
    """score of pair i = per-endpoint score of u_i + of v_i (NaN where neither was released)."""
    index = np.searchsorted(endpoints, draw.pairs)
    values = per_endpoint[index]
    both_missing = np.isnan(values).all(axis=1)
    return np.where(both_missing, np.nan, np.nansum(values, axis=1))


def mechanism_scores(draw: CanaryDraw, stats: dict[str, np.ndarray]) -> np.ndarray:
    """Σ over both endpoints and all their releases of ⟨ǎ_t − μ^a_t, Δ^a_t⟩ (module docstring)."""
    per_endpoint = np.where(stats["releases"] > 0, stats["mechanism"], np.nan)
    return _per_pair(draw, stats["endpoints"], per_endpoint)


def release_scores(draw: CanaryDraw, stats: dict[str, np.ndarray], received: ReceivedReleases) -> np.ndarray:
    """⟨Σ_t y_t − Σ_t μ^h_t, Σ_t Δ^h_t⟩ summed over both endpoints, with B's sums of y_t."""
    endpoints = stats["endpoints"]
    seen = received.train_count[endpoints] + received.eval_seen[endpoints]
    if not np.array_equal(seen, stats["releases"]):
        raise ValueError(
            "party B's record and party A's canary statistics count different releases of the canary "
            "endpoints: not the same run, or a release was lost"
        )
    total = received.train_sum[endpoints] + received.eval_embedding[endpoints] * received.eval_seen[endpoints, None, None]
    per_endpoint = np.sum((total - stats["mid_sum"]) * stats["delta_sum"], axis=(1, 2))
    return _per_pair(draw, endpoints, np.where(seen > 0, per_endpoint, np.nan))


def audit_canaries_white_box(
    draw: CanaryDraw, received: ReceivedReleases, run_dir: Path, delta: float, confidence: float,
) -> tuple[OneRunAudit, OneRunAudit]:
    """The one-run audit with the mechanism statistic and with B's release score, in that order."""
    stats = load_statistics(run_dir)
    if not np.array_equal(stats["endpoints"], np.sort(draw.pairs.reshape(-1))):
        raise ValueError(f"{run_dir / STATISTICS_FILE} belongs to another canary draw")
    return (
        canary_audit(mechanism_scores(draw, stats), draw.included, delta, confidence, MECHANISM_SCORER),
        canary_audit(release_scores(draw, stats, received), draw.included, delta, confidence, RELEASE_SCORER),
    )
