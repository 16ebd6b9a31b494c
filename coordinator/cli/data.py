"""`vesper data`: data sets: synthetic graphs, the institutions' own files imported, example files."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from vesper.coordinator.cli.shared import (
    PLAIN_HELP,
    console,
    fail,
)

data_app = typer.Typer(
    help="Data sets: import your own files, make synthetic graphs or example files.", no_args_is_help=True,
    **PLAIN_HELP,
)


class Profile(str, Enum):
    dense = "dense"
    sparse = "sparse"


@data_app.command("synth")
def data_synth(
    out: Path = typer.Argument(..., help="Where to write the .npz (heterophily layout, like Tolokers)."),
    nodes: int = typer.Option(2000, "--nodes", help="Number of nodes.", min=2),
    profile: Profile = typer.Option(Profile.sparse, "--profile", help="dense: every node has edges; sparse: about half are isolated."),
    mean_degree: Optional[float] = typer.Option(None, "--mean-degree", help="2|E|/N over all nodes (default: 40 dense, 2.2 sparse)."),
    classes: int = typer.Option(2, "--classes", help="Number of classes.", min=2),
    features: int = typer.Option(16, "--features", help="Feature dimension.", min=1),
    homophily: float = typer.Option(0.8, "--homophily", help="Fraction of edges joining two nodes of the same class."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generator.", min=0),
) -> None:
    """Generate a contextual stochastic block model graph with a chosen degree profile."""
    from vesper.benchmarks.synthetic import SyntheticSpec, generate, save_npz

    try:
        spec = SyntheticSpec(
            num_nodes=nodes, num_classes=classes, num_features=features, profile=profile.value,
            mean_degree=mean_degree, homophily=homophily, seed=seed,
        )
        graph = generate(spec)
    except ValueError as exc:
        fail(str(exc))
    save_npz(graph, out)
    degree = 2 * graph.num_edges / graph.num_nodes
    console.print(f"wrote {out}: {graph.num_nodes} nodes, {graph.num_edges} edges (mean degree {degree:.2f}), {classes} classes")


class Role(str, Enum):
    party_a = "party-a"
    party_b = "party-b"


@data_app.command("import")
def data_import(
    role: Role = typer.Option(..., "--role", help="party-a: edges and features; party-b: labels."),
    out: Path = typer.Option(..., "--out", help="The new store directory (refused if it exists and is not empty)."),
    edges: Optional[Path] = typer.Option(None, "--edges", help="party-a: the edges table (.csv, .parquet or .pq)."),
    features: Optional[Path] = typer.Option(None, "--features", help="party-a: the node features table."),
    labels: Optional[Path] = typer.Option(None, "--labels", help="party-b: the labels table."),
    src: Optional[str] = typer.Option(None, "--src", help="party-a: the edges' first key column (default src)."),
    dst: Optional[str] = typer.Option(None, "--dst", help="party-a: the edges' second key column (default dst)."),
    key: str = typer.Option("id", "--key", help="The key column of the features or labels table."),
    label: Optional[str] = typer.Option(None, "--label", help="party-b: the label column (default label)."),
    split: Optional[str] = typer.Option(
        None, "--split", help="party-b: the split column (train/val/test; default: 'split' when the file has it)."
    ),
) -> None:
    """Import an institution's own CSV or Parquet files into the store its service reads.

    Everything stays on this machine: party A's store holds graph.npz (its dataset file),
    nodes.parquet and import-report.json; party B's labels.parquet, classes.json and
    import-report.json (docs/data-import.md).
    """
    from vesper.common.store_directory import OutputDirectoryError
    from vesper.common.tabular import InputFileError

    given = {"--edges": edges, "--features": features, "--src": src, "--dst": dst, "--labels": labels,
             "--label": label, "--split": split}
    theirs = ("--labels", "--label", "--split") if role is Role.party_a else ("--edges", "--features", "--src", "--dst")
    wrong = [flag for flag in theirs if given[flag] is not None]
    if wrong:
        other = "party-b" if role is Role.party_a else "party-a"
        fail(f"--role {role.value} does not take {', '.join(wrong)} ({other}'s flags)")
    needed = ("--edges", "--features") if role is Role.party_a else ("--labels",)
    missing = [flag for flag in needed if given[flag] is None]
    if missing:
        fail(f"--role {role.value} needs {' and '.join(missing)}")
    try:
        if role is Role.party_a:
            _import_graph(edges, features, out, src or "src", dst or "dst", key)  # type: ignore[arg-type]
        else:
            _import_labels(labels, out, key, label or "label", split)  # type: ignore[arg-type]
    except (InputFileError, OutputDirectoryError) as exc:
        fail(str(exc), 1)


def _import_graph(edges: Path, features: Path, out: Path, src: str, dst: str, key: str) -> None:
    from vesper.party_a.graph_import import import_graph
    from vesper.party_a.graph_store_files import graph_file

    report = import_graph(edges, features, out, src=src, dst=dst, key=key)
    console.print(
        f"party A's graph store {out}: {report.nodes} nodes, {len(report.feature_columns)} feature columns; "
        f"{report.edge_rows_read} edge rows read, {report.self_loops_dropped} self-loops and "
        f"{report.duplicate_edges_dropped} duplicate edges dropped, {report.edges_kept} edges kept "
        f"({report.seconds:.1f} s)", highlight=False,
    )
    console.print(f"party A's dataset file: {graph_file(out)}", highlight=False)


def _import_labels(labels: Path, out: Path, key: str, label: str, split: str | None) -> None:
    from vesper.party_b.label_import import import_labels

    report = import_labels(labels, out, key=key, label=label, split=split or "split", require_split=split is not None)
    split_text = (
        ", ".join(f"{n} {name}" for name, n in report.split_counts.items()) if report.split_given
        else "none given (party B makes one)"
    )
    console.print(
        f"party B's label store {out}: {report.rows} keys, {report.labelled} labelled, {report.unlabelled} "
        f"unlabelled (to score); {len(report.classes)} classes ({report.labels_were}): "
        f"{', '.join(report.classes)}; split: {split_text} ({report.seconds:.1f} s)", highlight=False,
    )


@data_app.command("example")
def data_example(
    out: Path = typer.Option(..., "--out", help="Directory for party_a/edges.csv, party_a/features.csv, party_b/labels.csv."),
    seed: int = typer.Option(0, "--seed", help="Seed of the keys and of B's subset.", min=0),
) -> None:
    """Example files of both institutions, made from the bundled Cora graph (keys cust-xxxxxx)."""
    from vesper.benchmarks.example_files import write_example
    from vesper.common.store_directory import OutputDirectoryError

    try:
        files = write_example(out, seed)
    except OutputDirectoryError as exc:
        fail(str(exc), 1)
    console.print(
        f"wrote {files.edges} ({files.edge_rows} rows), {files.features} ({files.nodes} nodes) and {files.labels} "
        f"({files.b_rows} keys, {files.b_unlabelled} unlabelled, {files.b_only} not at party A)", highlight=False,
    )
    console.print(
        f"next: vesper data import --role party-a --edges {files.edges} --features {files.features} "
        f"--out STORE_A\n      vesper data import --role party-b --labels {files.labels} --out STORE_B",
        highlight=False,
    )
