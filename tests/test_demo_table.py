"""`vesper bench demo-table`: the README's demo table, from the runs `vesper demo` makes."""

from __future__ import annotations

import math
from pathlib import Path

from typer.testing import CliRunner

from vesper.benchmarks.demo_table import (
    BEGIN,
    DEFAULT_EXTRACTOR,
    END,
    DemoRow,
    append_row,
    baseline_of,
    demo_run,
    markdown,
)
from vesper.coordinator.cli import app


def _row(extractor: str, epsilon: float, seed: int, test: float, head: str = "") -> DemoRow:
    return DemoRow(
        extractor=extractor, epsilon_budget=epsilon, seed=seed, status="completed", metric="accuracy", test=test,
        head=head, epsilon_spent=0.0 if extractor == "mlp" else epsilon, noise_multiplier=None, sensitivity=None,
    )


def test_the_demo_with_no_flags_runs_the_default_extractor_and_its_baseline_the_mlp() -> None:
    run = demo_run(8.0, 1, None)
    assert run.extractor.name == DEFAULT_EXTRACTOR == "gap"
    assert (run.privacy.epsilon, run.seed) == (8.0, 1)
    assert "epochs" not in run.model_fields_set  # the extractor's own run defaults apply at party A
    assert baseline_of(run).extractor.name == "mlp"
    assert demo_run(8.0, 1, "pmp-gcn").extractor.name == "pmp-gcn"


def test_the_table_shows_every_seed_mean_and_the_head_b_kept() -> None:
    rows = [_row("gap", 8.0, s, v, "graph") for s, v in enumerate((0.76, 0.78, 0.77))]
    rows += [_row("mlp", 8.0, s, v) for s, v in enumerate((0.73, 0.74))]
    text = markdown(rows, ["gap", "mlp"], [8.0, math.inf], [0, 1, 2])
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "| gap | 8 | 0.760 / 0.780 / 0.770 | 0.770 ± 0.010 | graph / graph / graph | 8 |" in text
    assert "| mlp | 8 | 0.730 / 0.740 / — | 0.735 ± 0.007 | — | 0 |" in text
    assert "| gap | ∞ | — / — / — | — |" in text


def test_report_only_rewrites_the_readme_section_from_the_rows(tmp_path: Path) -> None:
    out = tmp_path / "results.csv"
    for seed, value in enumerate((0.70, 0.72)):
        append_row(out, _row("gap", 8.0, seed, value, "combined"))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold table\n{END}\nafter\n")
    result = CliRunner().invoke(app, [
        "bench", "demo-table", "--epsilon", "8", "--seeds", "2", "--out", str(out), "--report-only", "--update", str(readme),
    ])
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("after\n")
    assert "| gap | 8 | 0.700 / 0.720 | 0.710 ± 0.014 | combined / combined |" in text


def test_a_readme_without_the_markers_is_refused_unchanged(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    result = CliRunner().invoke(app, [
        "bench", "demo-table", "--out", str(tmp_path / "none.csv"), "--report-only", "--update", str(readme),
    ])
    assert result.exit_code != 0 and "marker" in result.output
    assert readme.read_text() == "no markers\n"
