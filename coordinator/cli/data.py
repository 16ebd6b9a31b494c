"""`vesper data`: data sets (synthetic graphs)."""

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

data_app = typer.Typer(help="Data sets: make synthetic graphs.", no_args_is_help=True, **PLAIN_HELP)


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
