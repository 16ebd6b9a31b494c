"""Edge inference from the releases (auditor/edge_inference.py) and the Figure-4 plot of attack
AUC against ε (benchmarks/attack_plots.py); docs/audit-attacks.md.

Synthetic records stand in for what party B keeps (party_b/release_record.py): each node's
release is its own random vector, plus (when the graph leaks) the mean of its neighbours'.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.auditor import edge_inference as ei
from vesper.auditor.received_releases import ReceivedReleases
from vesper.benchmarks.attack_plots import AttackRow, attack_cells, epsilon_positions, plot_attack_auc

NODES, DIM, MEAN_DEGREE = 400, 64, 4.0
NULL_TOLERANCE = 0.03  # |mean AUC − 0.5| over seeds; one AUC's null std here is ≈ 0.013 (≈ 1000 pairs a side)


def random_edges(rng: np.random.Generator, nodes: int = NODES, mean_degree: float = MEAN_DEGREE) -> np.ndarray:
    """Erdős–Rényi edges u < v."""
    upper = np.triu(rng.random((nodes, nodes)) < mean_degree / (nodes - 1), k=1)
    return np.argwhere(upper).astype(np.int64)


def releases_of(own: np.ndarray, edges: np.ndarray, leak: bool) -> np.ndarray:
    """e_v = z_v + mean of z_u over v's neighbours (leak), or e_v = z_v (no graph in the release)."""
    if not leak:
        return own
    nodes = own.shape[0]
    total = np.zeros_like(own)
    np.add.at(total, edges[:, 0], own[edges[:, 1]])
    np.add.at(total, edges[:, 1], own[edges[:, 0]])
    degree = np.bincount(edges.ravel(), minlength=nodes)
    return own + total / np.maximum(degree, 1)[:, None]


def record_of(releases: np.ndarray, received: np.ndarray | None = None) -> ReceivedReleases:
    """Even nodes arrive as training releases (summed over 3 epochs), odd nodes once in the
    evaluation pass, as B's record keeps them; nodes not ``received`` never arrive."""
    nodes = releases.shape[0]
    received = np.ones(nodes, bool) if received is None else received
    training = received & (np.arange(nodes) % 2 == 0)
    evaluated = received & ~training
    count = np.where(training, 3, 0)
    return ReceivedReleases(
        train_sum=(releases * count[:, None])[:, :, None].astype(np.float64), train_count=count,
        eval_embedding=np.where(evaluated[:, None], releases, 0.0)[:, :, None].astype(np.float32), eval_seen=evaluated,
        posterior_ids=np.zeros(0, np.int64), posterior_splits=np.zeros(0, np.int64),
        posteriors=np.zeros((0, 2), np.float32),
    )


def test_noiseless_neighbour_means_give_a_high_auc() -> None:
    rng = np.random.default_rng(0)
    edges = random_edges(rng)
    record = record_of(releases_of(rng.normal(size=(NODES, DIM)), edges, leak=True))
    result = ei.edge_inference(record, edges, seed=0)
    assert result.auc > 0.9
    assert result.positives == result.negatives == edges.shape[0]


def test_independent_releases_give_chance_auc() -> None:
    aucs = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        edges = random_edges(rng)
        aucs.append(ei.edge_inference(record_of(rng.normal(size=(NODES, DIM))), edges, seed=seed).auc)
    assert abs(statistics.fmean(aucs) - 0.5) < NULL_TOLERANCE, aucs
    assert all(abs(a - 0.5) < 2 * NULL_TOLERANCE for a in aucs), aucs


def test_pairs_with_an_unreceived_node_are_left_out() -> None:
    rng = np.random.default_rng(1)
    edges = random_edges(rng)
    received = rng.random(NODES) < 0.7
    record = record_of(releases_of(rng.normal(size=(NODES, DIM)), edges, leak=True), received)
    both = received[edges[:, 0]] & received[edges[:, 1]]
    result = ei.edge_inference(record, edges, seed=1)
    assert result.positives == result.negatives == int(both.sum())
    assert f"{int((~both).sum())} of {edges.shape[0]} edges left out" in result.note
    assert math.isfinite(result.auc) and result.auc > 0.9
    scores = ei.pair_scores(record, edges)
    assert np.isnan(scores[~both]).all() and np.isfinite(scores[both]).all()


def test_edges_in_both_directions_with_self_loops_are_counted_once() -> None:
    rng = np.random.default_rng(2)
    edges = random_edges(rng)
    messy = np.concatenate([edges, edges[:, ::-1], edges[:10], np.stack([np.arange(5), np.arange(5)], axis=1)])
    record = record_of(releases_of(rng.normal(size=(NODES, DIM)), edges, leak=True))
    assert np.array_equal(ei.canonical_edges(messy, NODES), edges)  # random_edges is sorted, u < v
    assert ei.edge_inference(record, messy, seed=0).auc == ei.edge_inference(record, edges, seed=0).auc


def test_max_pairs_caps_both_sides() -> None:
    rng = np.random.default_rng(3)
    edges = random_edges(rng)
    record = record_of(releases_of(rng.normal(size=(NODES, DIM)), edges, leak=True))
    result = ei.edge_inference(record, edges, seed=0, max_pairs=100)
    assert result.positives == result.negatives == 100


def test_a_record_sharing_no_edge_is_refused() -> None:
    rng = np.random.default_rng(4)
    edges = random_edges(rng)
    received = np.zeros(NODES, bool)
    received[0] = True
    with pytest.raises(ValueError, match="no edge"):
        ei.edge_inference(record_of(rng.normal(size=(NODES, DIM)), received), edges, seed=0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), nodes=st.integers(4, 60), density=st.floats(0.0, 0.6))
def test_negatives_are_distinct_non_adjacent_pairs_of_candidates(seed: int, nodes: int, density: float) -> None:
    rng = np.random.default_rng(seed)
    edges = random_edges(rng, nodes, density * (nodes - 1))
    candidates = np.flatnonzero(rng.random(nodes) < 0.8)
    possible = candidates.size * (candidates.size - 1) // 2
    inside = np.isin(edges, candidates).all(axis=1).sum()
    count = min(25, (possible - inside) // 2)  # leave rejection sampling room
    keys = ei.pair_keys(edges, nodes)
    negatives = ei.draw_negatives(candidates, keys, count, nodes, rng)
    assert negatives.shape == (count, 2)
    assert np.isin(negatives, candidates).all()
    assert (negatives[:, 0] != negatives[:, 1]).all()
    drawn = ei.pair_keys(negatives, nodes)
    assert np.unique(drawn).size == count and not np.isin(drawn, keys).any()


# -- Figure 4: attack AUC against ε ----------------------------------------------------------------
def attack_rows() -> list[AttackRow]:
    rows = []
    for attack in ("membership", "edge"):
        for extractor in ("mlp", "pmp-gcn"):
            for epsilon in (1.0, 4.0, math.inf):
                for seed in range(2):
                    auc = 0.5 + (0.0 if extractor == "mlp" else 0.05 * math.log2(min(epsilon, 32.0) + 1)) + 0.01 * seed
                    rows.append(AttackRow(
                        dataset="cora", extractor=extractor, accounting="visible-batch", epsilon=epsilon, seed=seed,
                        attack=attack, auc=auc, epsilon_spent=0.0 if extractor == "mlp" else epsilon, run_id=f"r{seed}",
                    ))
    return rows


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "plots" / "attack-auc.png"
    plot_attack_auc(attack_rows(), path, title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_an_empty_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no attack rows"):
        plot_attack_auc([], tmp_path / "empty.png")


def test_infinite_epsilon_sits_one_doubling_right_of_the_largest_budget() -> None:
    assert epsilon_positions([1.0, 32.0, math.inf, 4.0]) == {1.0: 1.0, 4.0: 4.0, 32.0: 32.0, math.inf: 64.0}
    assert epsilon_positions([math.inf]) == {math.inf: 2.0}


def test_cells_are_mean_and_sample_std_over_seeds() -> None:
    cells = attack_cells(attack_rows())
    cell = next(c for c in cells if c.attack == "edge" and c.extractor == "pmp-gcn" and c.epsilon == 1.0)
    assert cell.runs == 2
    assert cell.mean == pytest.approx(0.555)
    assert cell.std == pytest.approx(statistics.stdev([0.55, 0.56]))


def test_attack_rows_round_trip_through_csv_with_an_infinite_budget() -> None:
    rows = attack_rows()
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(AttackRow.model_fields))
    writer.writeheader()
    writer.writerows(row.model_dump() for row in rows)
    buffer.seek(0)
    assert [AttackRow.model_validate(r) for r in csv.DictReader(buffer)] == rows
