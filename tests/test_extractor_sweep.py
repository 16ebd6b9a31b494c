"""``vesper bench extractors`` with several budgets: ε-free extractors once, concurrent
workers, resuming, and the per-ε report. A stand-in for party A returns summaries."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from vesper.benchmarks import extractor_sweep as sweep
from vesper.common.config import Metric, RunConfig, RunSummary

EPSILONS = [1.0, 4.0, 8.0]


def _score(config: RunConfig) -> float:
    if config.extractor.name == "mlp":
        return 0.70 + 0.01 * config.seed
    # a graph extractor that improves with ε and beats the MLP clearly at ε = 8 only
    return {1.0: 0.60, 4.0: 0.70, 8.0: 0.80}[config.privacy.epsilon] + 0.01 * config.seed


def _summary(config: RunConfig) -> RunSummary:
    name = config.extractor.name
    return RunSummary(
        run_id=f"{name}-{config.seed}-{config.privacy.epsilon}", status="completed", dataset=config.dataset,
        extractor=name, decoder="concat", accounting=config.privacy.accounting,
        epsilon_budget=config.privacy.epsilon, epsilon_spent=0.0 if name == "mlp" else config.privacy.epsilon * 0.99,
        delta=1e-5, test_metric=Metric(name="accuracy", value=_score(config)), seconds=1.0,
        privacy_unit="edge",
    )


def _free(name: str) -> bool:
    return name == "mlp"


def test_planned_cells_run_epsilon_free_extractors_once() -> None:
    planned = sweep.planned_cells(EPSILONS, ["cora"], ["mlp", "gap"], 2, _free)
    assert [(e, x) for e, _, x, _ in planned].count((1.0, "mlp")) == 2
    assert not any(x == "mlp" and e != 1.0 for e, _, x, _ in planned)
    assert len([p for p in planned if p[2] == "gap"]) == 6


def test_sweep_runs_concurrently_resumes_and_reports(tmp_path: Path) -> None:
    base = RunConfig.model_validate({"privacy": {"epsilon": 1}, "epochs": 3})
    console = Console(file=open(tmp_path / "log.txt", "w"))
    active, peak, calls = [0], [0], []
    lock = threading.Lock()
    stop_after = [5]

    def drive(config: RunConfig) -> RunSummary:
        with lock:
            if stop_after[0] == 0:
                raise KeyboardInterrupt  # the sweep is killed mid-way
            stop_after[0] -= 1
            calls.append((config.extractor.name, config.privacy.epsilon, config.seed))
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return _summary(config)

    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(base, EPSILONS, ["cora"], ["mlp", "gap"], 2, tmp_path, [drive, drive], console, _free)
    assert peak[0] == 2  # two workers really ran at once
    first = len(calls)
    stop_after[0] = 100
    rows = sweep.run_sweep(base, EPSILONS, ["cora"], ["mlp", "gap"], 2, tmp_path, [drive, drive], console, _free)
    assert len(calls) == 2 + 6  # 2 MLP seeds once, 6 gap cells: nothing ran twice
    assert len(set(calls)) == len(calls) and first < len(calls)
    assert len(rows) == 8
    rows_again = sweep.run_sweep(base, EPSILONS, ["cora"], ["mlp", "gap"], 2, tmp_path, [drive], console, _free)
    assert len(calls) == 8 and len(rows_again) == 8  # complete: nothing runs

    report = sweep.markdown(rows, base, EPSILONS, 2, "vesper bench extractors ...", _free)
    assert "| ε = 1 | ε = 4 | ε = 8 |" in report
    assert "mlp read no edge" in report.replace("reads", "read")
    mlp_line = next(line for line in report.splitlines() if line.startswith("| mlp "))
    assert mlp_line.count("0.7050 ± 0.0071") == 3  # the same two runs in every column
    gap_line = next(line for line in report.splitlines() if line.startswith("| gap "))
    assert "0.8050 ± 0.0071 (+14.1 std), ε spent 7.92" in gap_line
    assert "**ε = 8:** beat the MLP by more than two pooled standard deviations: gap" in report
    assert "**ε = 4:** no extractor beats the MLP" in report
    sweep.plot(rows, EPSILONS, tmp_path / "results.png", _free)
    assert (tmp_path / "results.png").stat().st_size > 10_000
