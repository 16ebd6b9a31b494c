"""Tests of the synthetic CSBM generator in ``vesper.benchmarks.synthetic``.

Other tests and the scale runs rely on the generator's promises. Each promise has a
check here: exact edge counts and homophily, isolated nodes that really have no edge,
canonical edge arrays, stratified masks, and files the project's loaders accept.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vesper.benchmarks.synthetic import (
    SyntheticGraph,
    SyntheticSpec,
    generate,
    save_npz,
)
from vesper.common.dataset_files import load_graph_part, load_label_part
from vesper.common.splits import split_for

KEYS = {"node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks"}


def degrees(graph: SyntheticGraph) -> np.ndarray:
    return np.bincount(graph.edges.ravel(), minlength=graph.num_nodes)


def edge_homophily(graph: SyntheticGraph) -> float:
    labels = graph.node_labels
    return float(np.mean(labels[graph.edges[:, 0]] == labels[graph.edges[:, 1]]))


def assert_canonical(graph: SyntheticGraph) -> None:
    edges = graph.edges
    assert edges.dtype == np.int64
    assert edges.ndim == 2 and edges.shape[1] == 2
    if edges.size == 0:
        return
    u, v = edges[:, 0], edges[:, 1]
    assert np.all(u < v), "not canonical (u < v), or a self-loop"
    assert u.min() >= 0 and v.max() < graph.num_nodes
    keys = u * graph.num_nodes + v
    assert np.unique(keys).size == keys.size, "duplicate edges"


def assert_masks_partition(graph: SyntheticGraph) -> None:
    n = graph.num_nodes
    masks = (graph.train_masks, graph.val_masks, graph.test_masks)
    for mask in masks:
        assert mask.dtype == np.bool_ and mask.shape == (1, n)
    assert np.array_equal(sum(m.astype(np.int64) for m in masks), np.ones((1, n), dtype=np.int64))


@pytest.fixture(scope="module")
def sparse_5k() -> tuple[SyntheticSpec, SyntheticGraph]:
    spec = SyntheticSpec(num_nodes=5000, profile="sparse", seed=7)
    return spec, generate(spec)


@pytest.fixture(scope="module")
def dense_5k() -> tuple[SyntheticSpec, SyntheticGraph]:
    spec = SyntheticSpec(num_nodes=5000, profile="dense", num_classes=3, seed=11)
    return spec, generate(spec)


# ----------------------------------------------------------------------- determinism


@pytest.mark.parametrize("profile", ["sparse", "dense"])
def test_same_seed_gives_bitwise_identical_graphs(profile: str) -> None:
    spec = SyntheticSpec(num_nodes=1500, profile=profile, seed=123)  # type: ignore[arg-type]
    a, b = generate(spec), generate(spec)
    for field in dataclasses.fields(SyntheticGraph):
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert x.dtype == y.dtype and x.shape == y.shape, field.name
        assert x.tobytes() == y.tobytes(), field.name


def test_different_seeds_give_different_graphs() -> None:
    a = generate(SyntheticSpec(num_nodes=1500, seed=1))
    b = generate(SyntheticSpec(num_nodes=1500, seed=2))
    assert not np.array_equal(a.node_labels, b.node_labels)
    assert not np.array_equal(a.node_features, b.node_features)
    assert a.edges.shape == b.edges.shape  # same target ...
    assert not np.array_equal(a.edges, b.edges)  # ... different edges
    assert not np.array_equal(a.train_masks, b.train_masks)


# ------------------------------------------------------------------------------ edges


@pytest.mark.parametrize("fixture", ["sparse_5k", "dense_5k"])
def test_edges_are_canonical_and_hit_the_target(fixture: str, request: pytest.FixtureRequest) -> None:
    spec, graph = request.getfixturevalue(fixture)
    assert_canonical(graph)
    assert graph.num_edges == spec.target_edges == round(spec.resolved_mean_degree * spec.num_nodes / 2)
    assert 2 * graph.num_edges / graph.num_nodes == pytest.approx(spec.resolved_mean_degree, abs=1 / spec.num_nodes)


@pytest.mark.parametrize(
    ("profile", "mean_degree"), [("sparse", 2.2), ("sparse", 9.0), ("dense", 40.0), ("dense", 3.0)]
)
def test_mean_degree_matches(profile: str, mean_degree: float) -> None:
    spec = SyntheticSpec(num_nodes=3000, profile=profile, mean_degree=mean_degree, seed=5)  # type: ignore[arg-type]
    graph = generate(spec)
    assert graph.num_edges == round(mean_degree * 3000 / 2)
    assert degrees(graph).mean() == pytest.approx(mean_degree, abs=1e-3)


def test_profile_defaults() -> None:
    sparse, dense = SyntheticSpec(profile="sparse"), SyntheticSpec(profile="dense")
    assert (sparse.resolved_mean_degree, sparse.resolved_isolated_fraction) == (2.2, 0.5)
    assert (dense.resolved_mean_degree, dense.resolved_isolated_fraction) == (40.0, 0.0)


def test_sparse_profile_isolates_the_requested_fraction(sparse_5k: tuple[SyntheticSpec, SyntheticGraph]) -> None:
    spec, graph = sparse_5k
    deg = degrees(graph)
    # Exactly the weight-0 nodes have degree 0: every active node gets an edge.
    assert np.sum(deg == 0) == spec.num_isolated_nodes == 2500
    active = deg[deg > 0]
    # With half the nodes isolated, the others carry about twice the mean degree ...
    assert active.mean() == pytest.approx(2 * spec.resolved_mean_degree, rel=0.01)
    # ... and it is heavy-tailed: most have a few edges, a few are hubs.
    assert np.median(active) <= 4
    assert active.max() >= 10 * np.median(active)


def test_custom_isolated_fraction() -> None:
    spec = SyntheticSpec(num_nodes=4000, profile="sparse", isolated_fraction=0.3, mean_degree=4.0, seed=3)
    deg = degrees(generate(spec))
    assert np.mean(deg == 0) == pytest.approx(0.3, abs=0.01)


def test_dense_profile_has_no_isolated_nodes(dense_5k: tuple[SyntheticSpec, SyntheticGraph]) -> None:
    _, graph = dense_5k
    deg = degrees(graph)
    assert deg.min() >= 1
    # Mildly heavy-tailed: a spread, but no node far out of line.
    assert deg.max() < 10 * np.median(deg)


def test_dense_profile_keeps_every_node_even_at_low_mean_degree() -> None:
    deg = degrees(generate(SyntheticSpec(num_nodes=3000, profile="dense", mean_degree=2.0, seed=4)))
    assert deg.min() >= 1


@pytest.mark.parametrize("homophily", [0.0, 0.1, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("profile", ["sparse", "dense"])
def test_measured_homophily_matches(homophily: float, profile: str) -> None:
    spec = SyntheticSpec(num_nodes=5000, profile=profile, homophily=homophily, seed=9)  # type: ignore[arg-type]
    assert edge_homophily(generate(spec)) == pytest.approx(homophily, abs=0.05)


def test_homophily_with_imbalanced_classes() -> None:
    spec = SyntheticSpec(num_nodes=5000, class_balance=(0.78, 0.22), homophily=0.6, mean_degree=8.0, seed=2)
    graph = generate(spec)
    assert edge_homophily(graph) == pytest.approx(0.6, abs=0.05)
    assert np.mean(graph.node_labels == 0) == pytest.approx(0.78, abs=0.02)


def test_impossible_homophily_for_the_drawn_classes_raises() -> None:
    # 10 nodes in 2 classes hold at most 20 same-class pairs; 40 edges cannot all be.
    with pytest.raises(ValueError, match="homophily"):
        generate(SyntheticSpec(num_nodes=10, profile="dense", mean_degree=8.0, homophily=1.0))


# --------------------------------------------------------------------------- features


def test_features_and_labels_shapes(dense_5k: tuple[SyntheticSpec, SyntheticGraph]) -> None:
    spec, graph = dense_5k
    assert graph.node_features.dtype == np.float32
    assert graph.node_features.shape == (spec.num_nodes, spec.num_features)
    assert graph.node_labels.dtype == np.int64 and graph.node_labels.shape == (spec.num_nodes,)
    assert set(np.unique(graph.node_labels)) == set(range(spec.num_classes))


@pytest.mark.parametrize("signal", [0.0, 1.0, 3.0])
def test_class_means_are_feature_signal_sqrt2_apart(signal: float) -> None:
    spec = SyntheticSpec(num_nodes=6000, num_classes=3, num_features=16, feature_signal=signal, seed=1)
    graph = generate(spec)
    x, y = graph.node_features.astype(np.float64), graph.node_labels
    means = np.stack([x[y == k].mean(axis=0) for k in range(3)])
    centred = x - means[y]
    assert centred.std() == pytest.approx(1.0, abs=0.02)  # unit noise
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        # Sampling error of a 2000-node class mean in 16 dims adds about 0.13 in quadrature.
        expected = math.hypot(signal * math.sqrt(2), 0.13)
        assert np.linalg.norm(means[i] - means[j]) == pytest.approx(expected, abs=0.1)


# ----------------------------------------------------------------------------- split


@pytest.mark.parametrize("fixture", ["sparse_5k", "dense_5k"])
def test_masks_partition_nodes_and_are_stratified(fixture: str, request: pytest.FixtureRequest) -> None:
    spec, graph = request.getfixturevalue(fixture)
    assert_masks_partition(graph)
    labels = graph.node_labels
    overall = np.bincount(labels, minlength=spec.num_classes) / labels.size
    for mask, share in zip((graph.train_masks, graph.val_masks, graph.test_masks), (0.5, 0.25, 0.25)):
        members = labels[mask[0]]
        assert members.size / labels.size == pytest.approx(share, abs=0.01)
        proportions = np.bincount(members, minlength=spec.num_classes) / members.size
        np.testing.assert_allclose(proportions, overall, atol=0.02)


# ------------------------------------------------------------------------------ files


def test_save_npz_round_trip(tmp_path: Path, sparse_5k: tuple[SyntheticSpec, SyntheticGraph]) -> None:
    spec, graph = sparse_5k
    path = tmp_path / "graph.npz"
    save_npz(graph, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.npz"]  # no temp file left, no ".npz.npz"
    with np.load(path, allow_pickle=False) as archive:
        assert set(archive.files) == KEYS
        loaded = {key: archive[key] for key in KEYS}
    n, f, m = spec.num_nodes, spec.num_features, spec.target_edges
    expected = {
        "node_features": (np.float32, (n, f)),
        "node_labels": (np.int64, (n,)),
        "edges": (np.int64, (m, 2)),
        "train_masks": (np.bool_, (1, n)),
        "val_masks": (np.bool_, (1, n)),
        "test_masks": (np.bool_, (1, n)),
    }
    for key, (dtype, shape) in expected.items():
        assert loaded[key].dtype == dtype, key
        assert loaded[key].shape == shape, key
        assert np.array_equal(loaded[key], getattr(graph, key)), key


def test_saved_file_loads_through_the_project_loaders(
    tmp_path: Path, dense_5k: tuple[SyntheticSpec, SyntheticGraph]
) -> None:
    spec, graph = dense_5k
    path = tmp_path / "synthetic.npz"
    save_npz(graph, path)

    graph_part = load_graph_part(path)
    assert graph_part.num_nodes == spec.num_nodes
    assert graph_part.edges.dtype == np.int64 and np.array_equal(graph_part.edges, graph.edges)
    assert graph_part.features.dtype == np.float32 and np.array_equal(graph_part.features, graph.node_features)

    label_part = load_label_part(path)
    assert label_part.labels.dtype == np.int64 and np.array_equal(label_part.labels, graph.node_labels)
    assert label_part.masks is not None and len(label_part.masks) == 3
    for loaded, mine in zip(label_part.masks, (graph.train_masks, graph.val_masks, graph.test_masks)):
        assert loaded.dtype == np.bool_ and loaded.shape == (1, spec.num_nodes)
        assert np.array_equal(loaded, mine)

    split = split_for(label_part, seed=0)
    assert split.train.size + split.val.size + split.test.size == spec.num_nodes


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("num_nodes", {"num_nodes": 1}),
        ("num_nodes", {"num_nodes": 2.5}),
        ("num_nodes", {"num_nodes": True}),
        ("num_classes", {"num_classes": 1}),
        ("num_features", {"num_features": 0}),
        ("profile", {"profile": "medium"}),
        ("mean_degree", {"mean_degree": -1.0}),
        ("mean_degree", {"mean_degree": float("nan")}),
        ("mean_degree", {"num_nodes": 5, "mean_degree": 10.0}),  # more edges than pairs
        ("homophily", {"homophily": 1.5}),
        ("homophily", {"homophily": -0.1}),
        ("feature_signal", {"feature_signal": -1.0}),
        ("feature_signal", {"feature_signal": float("inf")}),
        ("class_balance", {"class_balance": (0.5, 0.6)}),
        ("class_balance", {"class_balance": (1.0,)}),
        ("class_balance", {"class_balance": (1.2, -0.2)}),
        ("class_balance", {"class_balance": ("a", "b")}),
        ("isolated_fraction", {"isolated_fraction": 1.0}),
        ("isolated_fraction", {"isolated_fraction": -0.1}),
        ("isolated_fraction", {"num_nodes": 4, "isolated_fraction": 0.9, "mean_degree": 1.0}),
        ("seed", {"seed": -1}),
    ],
)
def test_invalid_spec_names_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=field):
        SyntheticSpec(**kwargs)  # type: ignore[arg-type]


def test_class_balance_list_is_stored_as_tuple() -> None:
    spec = SyntheticSpec(num_classes=3, class_balance=[0.5, 0.3, 0.2])  # type: ignore[arg-type]
    assert spec.class_balance == (0.5, 0.3, 0.2)
    hash(spec)


# ------------------------------------------------------------------------- properties


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_nodes=st.integers(2, 80),
    num_classes=st.integers(2, 4),
    num_features=st.integers(1, 5),
    profile=st.sampled_from(["dense", "sparse"]),
    mean_degree=st.floats(0.0, 8.0),
    homophily=st.floats(0.0, 1.0),
    isolated_fraction=st.floats(0.0, 0.7),
    seed=st.integers(0, 2**32),
)
def test_small_random_specs_give_valid_graphs(
    num_nodes: int,
    num_classes: int,
    num_features: int,
    profile: str,
    mean_degree: float,
    homophily: float,
    isolated_fraction: float,
    seed: int,
) -> None:
    """Any spec either raises a ValueError that names its cause or gives a valid graph."""
    try:
        spec = SyntheticSpec(
            num_nodes=num_nodes,
            num_classes=num_classes,
            num_features=num_features,
            profile=profile,  # type: ignore[arg-type]
            mean_degree=mean_degree,
            homophily=homophily,
            isolated_fraction=isolated_fraction,
            seed=seed,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph = generate(spec)
    except ValueError as exc:
        assert any(name in str(exc) for name in ("mean_degree", "isolated_fraction", "homophily")), exc
        return
    assert_canonical(graph)
    assert_masks_partition(graph)
    assert graph.node_features.shape == (num_nodes, num_features)
    assert graph.node_features.dtype == np.float32 and np.isfinite(graph.node_features).all()
    assert graph.node_labels.min() >= 0 and graph.node_labels.max() < num_classes
    if not caught:  # a near-complete graph may fall short, but must then say so
        assert graph.num_edges == spec.target_edges
    else:
        assert graph.num_edges < spec.target_edges
    # Isolated nodes never touch an edge, so at least that many have degree 0.
    assert np.sum(degrees(graph) == 0) >= spec.num_isolated_nodes
    if graph.num_edges:
        same = np.sum(graph.node_labels[graph.edges[:, 0]] == graph.node_labels[graph.edges[:, 1]])
        if not caught:
            assert same == round(homophily * spec.target_edges)
