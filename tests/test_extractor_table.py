"""``vesper bench extractors`` bookkeeping: resumable cells, mean ± std, the MLP verdict.

The runs themselves go through the services (the command is a benchmark, not a test);
here a stand-in for party A returns summaries so the table's arithmetic can be checked.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from rich.console import Console

from vesper.benchmarks import extractor_table as table
from vesper.common.config import Metric, RunConfig, RunSummary

SCORES = {"mlp": [0.70, 0.72, 0.71], "pmp-gin": [0.80, 0.81, 0.79], "gap": [0.69, 0.74, 0.70]}


def _summary(config: RunConfig) -> RunSummary:
    value = SCORES[config.extractor.name][config.seed]
    return RunSummary(
        run_id=f"{config.extractor.name}-{config.seed}", status="completed", dataset=config.dataset,
        extractor=config.extractor.name, decoder="concat", accounting=config.privacy.accounting,
        epsilon_budget=config.privacy.epsilon, epsilon_spent=0.0 if config.extractor.name == "mlp" else 3.9,
        delta=1e-5, test_metric=Metric(name="roc_auc", value=value), seconds=1.0,
    )


def test_cells_resume_and_report(tmp_path: Path) -> None:
    base = RunConfig.model_validate({"privacy": {"epsilon": 4}, "epochs": 3})
    calls: list[tuple[str, int]] = []
    killed = []

    def drive(config: RunConfig) -> RunSummary:
        calls.append((config.extractor.name, config.seed))
        if config.extractor.name == "gap" and config.seed == 2 and not killed:
            killed.append(True)
            raise KeyboardInterrupt  # the table is killed mid-way
        return _summary(config)

    console = Console(file=open(tmp_path / "log.txt", "w"))
    extractors = ["mlp", "pmp-gin", "gap"]
    try:
        table.run_table(base, ["/data/tolokers.npz"], extractors, 3, tmp_path, drive, console)
    except KeyboardInterrupt:
        pass
    assert len(table.read_rows(tmp_path / "results.csv")) == 8
    calls.clear()
    rows = table.run_table(base, ["/data/tolokers.npz"], extractors, 3, tmp_path, drive, console)
    assert calls == [("gap", 2)]  # only the missing cell ran again
    assert len(rows) == 9 and {r.dataset for r in rows} == {"tolokers"}

    cells = {c.extractor: c for c in table.cells(rows)}
    assert cells["gap"].mean == statistics.fmean(SCORES["gap"])
    assert cells["gap"].std == statistics.stdev(SCORES["gap"])
    assert cells["pmp-gin"].epsilon_spent == 3.9
    gin_gap = table.gap_in_stds(cells["pmp-gin"], cells["mlp"])
    assert gin_gap > 2 and table.gap_in_stds(cells["gap"], cells["mlp"]) < 2
    report = table.markdown(rows, base, 3, "vesper bench extractors ...")
    assert "| pmp-gin | edge | 0.8000 ± 0.0100 | 3 | 3.9 |" in report
    assert "beats the MLP by more than two pooled standard deviations: pmp-gin" in report
    assert "gap" not in report.split("beats the MLP")[1]
    table.plot(rows, tmp_path / "results.png")
    assert (tmp_path / "results.png").stat().st_size > 10_000


def test_no_extractor_beating_the_mlp_is_said_plainly() -> None:
    mlp = table.Cell(dataset="cora", extractor="mlp", metric="accuracy", values=[0.75, 0.76], epsilon_spent=0,
                     privacy_unit="edge", seconds=1)
    gcn = mlp.model_copy(update={"extractor": "pmp-gcn", "values": [0.74, 0.77]})
    text = table.verdict([mlp, gcn])
    assert text.startswith("no graph extractor beats the MLP") and "pmp-gcn at +0.0000" in text


def test_recipes_apply_on_top_of_the_base_config() -> None:
    base = RunConfig.model_validate({"extractor": {"dim": 32, "name": "pmp-gin", "params": {"x": 1}}, "epochs": 7})
    config = table.run_config(base, "cora", "gap", 4)
    assert config.extractor.name == "gap" and config.seed == 4
    assert config.extractor.dim == table.RECIPES["gap"].get("extractor.dim", 32)
    assert config.epochs == table.RECIPES["gap"].get("epochs", 7)
    assert config.extractor.params == {} and config.extractor.layers == table.RECIPES["gap"]["extractor.layers"]
    assert table.run_config(base, "cora", "mlp", 0).epochs == 7  # no recipe: the base run's
    table.RECIPES["probe"] = {"epochs": 3, "extractor.fanout": 0}
    try:
        probe = table.run_config(base, "cora", "probe", 0)
    finally:
        del table.RECIPES["probe"]
    assert probe.epochs == 3 and probe.extractor.fanout == 0 and probe.extractor.dim == 32
