"""``vesper bench degradation`` (the rule of issue #21 item 1) and ``vesper bench anchors`` (item 5):
their decisions from rows, and the published numbers file."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from vesper.benchmarks.anchors import (
    BEGIN,
    END,
    load_anchors,
    markdown,
)
from vesper.benchmarks.degradation import cell, cells, own_epochs
from vesper.benchmarks.doc_sections import DocSectionError, replace_section
from vesper.benchmarks.extractor_table import TableRow
from vesper.benchmarks.utility_options import SHARED_FILES


def _rows(extractor: str, values: list[float], epsilon: float = 4.0, dataset: str = "cora", head: str = "") -> list[TableRow]:
    return [
        TableRow(
            dataset=dataset, extractor=extractor, seed=seed, epsilon_budget=epsilon, accounting="visible-batch",
            status="completed", metric="accuracy", test=value, head=head,
        )
        for seed, value in enumerate(values)
    ]


MLP = _rows("mlp", [0.74, 0.75, 0.745, 0.742, 0.748])


def test_a_cell_clearly_below_the_mlp_is_below_and_one_level_with_it_is_not() -> None:
    below = cell(MLP + _rows("gap", [0.60, 0.62, 0.61, 0.605, 0.615]), "cora", "gap", 4.0)
    assert below.below and below.p_below is not None and below.p_below < 1e-4
    level = cell(MLP + _rows("gap", [0.745, 0.74, 0.75, 0.743, 0.747], head="edge-free"), "cora", "gap", 4.0)
    assert not level.below and level.p_below > 0.05 and level.kept == {"edge-free": 5}
    assert "kept edge-free 5" in level.text and "**below**" in below.text


def test_the_mlp_serves_every_epsilon_and_missing_cells_are_not_measured() -> None:
    found = cells(MLP + _rows("gap", [0.8, 0.81], epsilon=math.inf), ["cora"], ["mlp", "gap"], [4.0, math.inf])
    by_eps = {c.epsilon: c for c in found}
    assert by_eps[math.inf].p_below is not None and not by_eps[math.inf].below
    assert by_eps[4.0].values == [] and by_eps[4.0].p_below is None and by_eps[4.0].text == "—"
    assert all(c.extractor != "mlp" for c in found)


def test_the_table_names_each_extractor_s_own_epochs_and_its_path_s_stage() -> None:
    found = cells(MLP + _rows("gap", [0.76, 0.77]) + _rows("pmp-gcn", [0.75, 0.76]), ["cora"], ["mlp", "gap", "pmp-gcn"],
                  [4.0])
    assert own_epochs(found) == "gap: 20 (its edge-free path 30 alone first)"  # pmp-gcn trains the run's 50


def test_the_verdict_says_how_many_fallback_cells_would_test_below_by_chance() -> None:
    from vesper.benchmarks.degradation import chance_note

    fallback = [
        cell(MLP + _rows("gap", [0.745, 0.74, 0.75, 0.743, 0.747], epsilon=e, head="edge-free"), "cora", "gap", e)
        for e in (1.0, 4.0, 8.0)
    ]
    low = cell(MLP + _rows("vfgnn", [0.70, 0.71, 0.705, 0.70, 0.71], head="edge-free"), "cora", "vfgnn", 4.0)
    mixed = cell(MLP + _rows("pmp-gcn", [0.8, 0.81], head="graph"), "cora", "pmp-gcn", 4.0)
    (note, _) = chance_note([*fallback, low, mixed])
    assert "in 4 of the measured cells B kept the edge-free head in every run, but its runs are not" in note
    assert "about 0.2 of them would test below" in note and "1 of them are below" in note
    assert chance_note([mixed]) == []
    # common random numbers: the fallback cell's runs are the MLP's own, value for value
    same = cell(MLP + _rows("gap", [0.742, 0.74, 0.745, 0.748, 0.75], head="edge-free"), "cora", "gap", 4.0)
    (note, _) = chance_note([same, low])
    assert note.startswith("In 1 of the measured cells B kept the edge-free head in every run and the cell's test")
    assert "none of them can test below. 0 of them are below." in note and "Chance: in 1 of" in note


def test_the_published_anchors_file_is_valid_and_names_every_source() -> None:
    anchors = load_anchors()
    assert {a.method for a in anchors} == {"GAP", "ProGAP", "DPDGC", "LPGNet"}
    assert all(a.source and a.url.startswith("https://") and a.split for a in anchors)
    cora = [a for a in anchors if a.dataset == "cora" and a.model == "DPDGC" and a.epsilon == 1.0]
    assert cora and cora[0].fraction == pytest.approx(0.7771)


def test_the_anchors_table_puts_vesper_beside_the_papers_and_replaces_only_its_section() -> None:
    rows = MLP + _rows("gap", [0.76, 0.77]) + _rows("pmp-gcn", [0.78, 0.79])
    text = markdown(rows, load_anchors(), ["cora", "synthetic-dense"], ["mlp", "gap", "pmp-gcn"], ["r.csv"])
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "| 4 | pmp-gcn 0.785 ± 0.007 (2) | 0.765 ± 0.007 (2) | 0.745 ± 0.004 (5) |" in text
    assert "| DPDGC | DPDGC | 1 | 0.777" in text
    assert "none of GAP, ProGAP, DPDGC and LPGNet reports this graph" in text
    document = f"before\n{BEGIN}\nold\n{END}\nafter\n"
    assert replace_section(document, text, BEGIN, END) == f"before\n{text}\nafter\n"
    with pytest.raises(DocSectionError, match="no .* section"):
        replace_section("no markers", text, BEGIN, END)


UTILITY_DOC = Path(__file__).resolve().parents[1] / "docs" / "utility.md"


@pytest.mark.skipif(
    not all(path.is_file() for path in SHARED_FILES.values()), reason="the shared Tolokers and Twitch ENGB files are absent"
)
def test_the_degradation_table_is_what_make_bench_degradation_writes_from_its_committed_rows(tmp_path: Path) -> None:
    """docs/utility.md's degradation table is generated from docs/utility-runs.csv by the command
    `make bench-degradation` runs (every installed edge-level extractor), not typed: writing it
    again from the rows changes nothing, and an extractor added without its runs would show."""
    from typer.testing import CliRunner

    from vesper.coordinator.cli import app

    out = tmp_path / "degradation"
    out.mkdir()
    shutil.copy(UTILITY_DOC.with_name("utility-runs.csv"), out / "results.csv")
    doc = tmp_path / "utility.md"
    shutil.copy(UTILITY_DOC, doc)
    epsilons = [arg for eps in ("1", "4", "8", "inf") for arg in ("--epsilon", eps)]
    result = CliRunner().invoke(app, [
        "bench", "degradation", "--out", str(out), "--report-only", "--update", str(doc), *epsilons,
        "--seeds", "5", "--epochs", "50", "--jobs", "2", "--synthetic-nodes", "2708", "--in-process",
    ])
    assert result.exit_code == 0, result.output
    assert doc.read_text() == UTILITY_DOC.read_text()


def test_the_committed_synthetic_specs_are_the_graphs_the_generator_makes(tmp_path: Path) -> None:
    """docs/utility-runs-spec.json (copied by `make bench-degradation` beside the committed rows)
    records the synthetic graphs those rows were made on; the generator must still make them,
    array for array, or a resumed benchmark refuses (and the rows would describe other graphs)."""
    from vesper.benchmarks.utility_datasets import ensure_synthetic

    committed = json.loads(UTILITY_DOC.with_name("utility-runs-spec.json").read_text())
    for label, record in committed.items():
        ensure_synthetic(tmp_path, label, record["spec"]["num_nodes"], set())
    assert json.loads((tmp_path / "spec.json").read_text()) == committed
