"""python -m vesper.benchmarks.head_rules: both head rules read off the same runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vesper.benchmarks.extractor_table import TableRow
from vesper.benchmarks.head_rules import BEGIN, END, cells, main, markdown, maximum_head, summaries

HEADS = ("edge-free", "graph", "combined")


def test_the_earlier_rule_takes_the_best_validation_metric_ties_to_the_simplest() -> None:
    assert maximum_head({"val@edge-free": 0.70, "val@graph": 0.71, "val@combined": 0.705}) == "graph"
    assert maximum_head({"val@edge-free": 0.71, "val@graph": 0.71, "val@combined": 0.71}) == "edge-free"
    assert maximum_head({"val@edge-free": 0.70, "val@graph": 0.72, "val@combined": 0.72}) == "graph"


def _grid(out: Path) -> None:
    """An MLP at 0.80 and an extractor whose graph head leads on validation by a hair and loses on
    test in every run: B's rule kept the edge-free head (0.80), the maximum would keep graph (0.70)."""
    rows = []
    for seed in range(4):
        rows.append(TableRow(dataset="g", extractor="mlp", seed=seed, epsilon_budget=4.0, accounting="visible-batch",
                             status="completed", metric="accuracy", test=0.80 + 0.002 * seed, run_id=f"m{seed}"))
        run_id = f"x{seed}"
        rows.append(TableRow(dataset="g", extractor="x", seed=seed, epsilon_budget=4.0, accounting="visible-batch",
                             status="completed", metric="accuracy", test=0.80 + 0.001 * seed, run_id=run_id, head="edge-free"))
        metrics = {"val@edge-free": 0.75, "val@graph": 0.751, "val@combined": 0.74,
                   "test@edge-free": 0.80 + 0.001 * seed, "test@graph": 0.70 + 0.003 * seed, "test@combined": 0.78}
        summary = out / "in-process-0" / "party_a" / "runs" / run_id / "summary.json"
        summary.parent.mkdir(parents=True)
        summary.write_text(json.dumps({"run_id": run_id, "head_metrics": {
            key: {"name": "accuracy", "value": value} for key, value in metrics.items()}}))
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(TableRow.model_fields))
        writer.writeheader()
        writer.writerows(row.model_dump() for row in rows)


def test_each_rule_is_read_off_the_same_runs(tmp_path: Path) -> None:
    from vesper.benchmarks.extractor_table import read_rows

    _grid(tmp_path)
    (cell,) = cells(read_rows(tmp_path / "results.csv"), summaries(tmp_path))
    assert cell.differ == 4 and len(cell.baseline) == 4
    assert cell.tests["kept"] == cell.tests["edge-free"] == pytest.approx([0.800, 0.801, 0.802, 0.803])
    assert cell.tests["maximum"] == pytest.approx([0.700, 0.703, 0.706, 0.709])
    assert cell.p_below("maximum") < 0.05 < cell.p_below("kept")
    text = markdown([cell], "cmd")
    assert "| x | g | 4 | 4 | 0.803 | 0.80" in text and text.count("**below** |") == 1
    assert "4 of 4 runs differ. Cells below the MLP: kept 0, maximum 1, edge-free 0." in text
    level = cell.model_copy(update={"differ": 0, "tests": {**cell.tests, "maximum": cell.tests["kept"]}})
    assert "| x | g |" in markdown([level], "cmd") and "| x | g |" not in markdown([level], "cmd", notable_only=True)
    assert "The 1 cells of 1 where" in markdown([cell], "cmd", notable_only=True)


def test_the_command_updates_its_section_and_refuses_an_empty_folder(tmp_path: Path) -> None:
    _grid(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    runner = CliRunner()
    import typer

    app = typer.Typer()
    app.command()(main)
    result = runner.invoke(app, ["--out", str(tmp_path), "--update", str(doc)])
    assert result.exit_code == 0, result.output
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text and "| x | g |" in text
    empty = runner.invoke(app, ["--out", str(tmp_path / "nothing")])
    assert empty.exit_code == 2 and "no runs in" in empty.output
