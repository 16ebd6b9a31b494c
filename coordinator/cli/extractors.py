"""`vesper extractors`: the extractors installed on this machine."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich import box
from rich.table import Table

from vesper.coordinator.cli.shared import (
    console,
)


def extractors_command(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the extractors installed on this machine: privacy unit, cost model, hyper-parameters.

    Party A runs the extractor, so what counts is what is installed where A runs; a
    third-party package adds one under the `vesper.extractors` entry-point group.
    """
    from vesper.party_a.extractors.registry import describe_params, installed, path_defaults

    found = installed()
    if as_json:
        rows = []
        for item in found:
            row: dict[str, Any] = {"name": item.name, "source": item.source, "distribution": item.distribution}
            if item.extractor is None:
                row["error"] = item.error
            else:
                spec = item.extractor.spec
                row.update({
                    "privacy_unit": spec.privacy_unit, "cost_model": spec.cost_model, "summary": spec.summary,
                    "accountings": list(spec.accountings), "edge_sampling": spec.edge_sampling,
                    "uses": list(spec.uses), "docs": spec.docs, "run_defaults": spec.run_defaults,
                    "edge_free_path_defaults": path_defaults(spec.name),
                    "params": [{"name": n, "default": d, "description": t} for n, d, t in describe_params(spec.params)],
                })
            rows.append(row)
        console.print_json(json.dumps(rows))
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("name", "privacy unit", "cost model", "accounting"):
        table.add_column(column, no_wrap=True)
    for item in found:
        if item.extractor is None:
            table.add_row(item.name, "-", "-", "[red]unavailable[/]")
            continue
        spec = item.extractor.spec
        table.add_row(spec.name, spec.privacy_unit, spec.cost_model, ", ".join(spec.accountings))
    console.print(table)
    for item in found:
        if item.extractor is None:
            console.print(f"[bold]{item.name}[/] ({item.source}) is unavailable: {item.error}", highlight=False)
            continue
        spec = item.extractor.spec
        console.print(f"[bold]{spec.name}[/]: {spec.summary}", highlight=False)
        shared = ", ".join(spec.uses) or "none"
        console.print(f"  from {item.distribution}; docs {spec.docs or '-'}; reads extractor.{{{shared}}}", highlight=False)
        if spec.run_defaults:
            defaults = ", ".join(f"{key}={value}" for key, value in spec.run_defaults.items())
            console.print(f"  its defaults, for what a run does not set: {defaults}", highlight=False)
        if path := path_defaults(spec.name):
            keys = ", ".join(f"{key}={value}" for key, value in path.items())
            console.print(f"  with them its edge-free path keeps the MLP baseline's: {keys}", highlight=False)
        for name, default, description in describe_params(spec.params):
            console.print(f"  --param {name}=…  (default {default}) {description}", highlight=False)
