"""``vesper bench label-privacy`` without services: a stand-in for party A returns summaries and
writes gradients.npz the way A does (node_ids, gradients, first_gradients, num_classes)."""

from __future__ import annotations

import math
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from vesper.auditor.label_attack import auc_ceiling
from vesper.benchmarks import label_privacy_table as table
from vesper.common.config import Metric, RunConfig, RunSummary

EPSILONS = [1.0, 4.0, math.inf]
NODES = 800
PRIVATE = np.arange(0, 400)  # B's labelled training nodes
QUERIES = np.arange(400, 460)  # pate: answered queries drawn from B's validation split
LABELS = (np.random.default_rng(7).random(NODES) < 0.25).astype(np.int64)


def _truth(config: RunConfig) -> table.TrueLabels:
    return table.TrueLabels(LABELS, PRIVATE)


def _randomised(labels: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    if math.isinf(epsilon):
        return labels
    flip = rng.random(labels.size) >= math.exp(epsilon) / (1 + math.exp(epsilon))
    return np.where(flip, 1 - labels, labels)


def _gradients(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(G2) in miniature: (p − y) along one direction, plus a little noise; p = the prior 0.25."""
    axis = np.linspace(1.0, 2.0, 8)
    return ((0.25 - labels)[:, None] * axis + 0.05 * rng.normal(size=(labels.size, 8))).astype(np.float32)


class FakePartyA:
    """Drives a 'run': writes A's gradients.npz and returns a summary; optional kill switch and leak."""

    def __init__(self, root: Path, leak: bool = False, record: bool = True) -> None:
        self.root, self.leak, self.record = root, leak, record
        self.calls: list[tuple[str, float, int]] = []
        self.lock = threading.Lock()
        self.stop_after: int | None = None
        self.active = self.peak = 0

    def __call__(self, config: RunConfig) -> tuple[RunSummary, Path | None]:
        mode, epsilon, seed = config.label_privacy.mode, config.label_privacy.epsilon, config.seed
        assert config.record_gradients
        with self.lock:
            if self.stop_after is not None:
                if self.stop_after == 0:
                    raise KeyboardInterrupt  # the table is killed mid-way
                self.stop_after -= 1
            self.calls.append((mode, epsilon, seed))
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.02)
        rng = np.random.default_rng(1000 * seed + (0 if math.isinf(epsilon) else int(epsilon)))
        run_id = f"{mode}-{epsilon}-{seed}"
        path = self.root / run_id / "gradients.npz"
        if mode == "pate":
            ids = QUERIES
            used = LABELS[ids]  # stands for the teachers' answers: what matters is which nodes
        else:
            ids = PRIVATE
            used = LABELS[ids] if self.leak else _randomised(LABELS[ids], epsilon, rng)
        if self.record:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, node_ids=ids, gradients=_gradients(used, rng), first_gradients=_gradients(used, rng),
                     num_classes=np.int64(2))
        private = mode != "none"
        summary = RunSummary(
            run_id=run_id, status="completed", dataset=config.dataset, extractor=config.extractor.name,
            decoder="concat", accounting="visible-batch", epsilon_budget=math.inf, epsilon_spent=math.inf, delta=1e-4,
            test_metric=Metric(name="roc_auc", value=0.80 - (0.1 / epsilon if private else 0) + 0.01 * seed),
            label_privacy=mode, label_epsilon_budget=epsilon if private else None,
            label_epsilon_spent=epsilon if private else None, label_delta=1e-5 if private else None,
            label_note=f"{len(ids)} queries answered" if mode == "pate" else "", seconds=0.1,
        )
        with self.lock:
            self.active -= 1
        return summary, (path if self.record else None)


def _base() -> RunConfig:
    return RunConfig.model_validate({"epochs": 3, "extractor": {"name": "mlp"}, "privacy": {"epsilon": "inf"}})


def _console(tmp_path: Path) -> Console:
    return Console(file=(tmp_path / "log.txt").open("w"))


def _context(seeds: int = 2) -> table.TableContext:
    return table.TableContext("vesper bench label-privacy --dataset toy", "toy", "mlp", "relational", 3, math.inf, seeds)


def test_the_reference_row_runs_once_per_seed_and_every_mode_at_every_finite_epsilon() -> None:
    planned = table.planned_cells(["rr", "pate"], EPSILONS, 2)
    assert [p for p in planned if p[0] == "none"] == [("none", math.inf, 0), ("none", math.inf, 1)]
    assert sorted(p for p in planned if p[0] != "none") == sorted(
        (m, e, s) for m in ("rr", "pate") for e in (1.0, 4.0) for s in (0, 1)
    )
    assert not any(p[0] != "none" and math.isinf(p[1]) for p in planned)
    assert table.planned_cells(["rr"], [2.0], 1) == [("rr", 2.0, 0)]  # no ∞ asked: no reference runs


def test_cell_config_sets_label_privacy_and_recording_and_swaps_the_extractor_for_pate() -> None:
    base = _base()
    rr = table.cell_config(base, "toy.npz", "rr", 2.0, 1, "relational")
    assert (rr.label_privacy.mode, rr.label_privacy.epsilon, rr.seed, rr.record_gradients) == ("rr", 2.0, 1, True)
    assert rr.extractor.name == "mlp" and rr.dataset == "toy.npz" and math.isinf(rr.privacy.epsilon)
    pate = table.cell_config(base, "toy.npz", "pate", 2.0, 0, "relational")
    assert pate.extractor.name == "relational" and pate.label_privacy.pate == base.label_privacy.pate
    none = table.cell_config(base, "toy.npz", "none", math.inf, 0, "relational")
    assert none.label_privacy.mode == "none" and none.extractor.name == "mlp"


def test_table_runs_concurrently_resumes_and_reports_from_the_numbers(tmp_path: Path) -> None:
    party_a = FakePartyA(tmp_path / "party_a")
    party_a.stop_after = 5
    out = tmp_path / "bench"
    with pytest.raises(KeyboardInterrupt):
        table.run_label_table(_base(), "toy", EPSILONS, ["rr", "pate"], 2, out, [party_a, party_a],
                              _console(tmp_path), pate_extractor="relational", truth=_truth)
    assert party_a.peak == 2  # two workers really ran at once
    assert len(table.read_rows(out / "results.csv")) == 5
    party_a.stop_after = None
    rows = table.run_label_table(_base(), "toy", EPSILONS, ["rr", "pate"], 2, out, [party_a, party_a],
                                 _console(tmp_path), pate_extractor="relational", truth=_truth)
    assert len(party_a.calls) == len(set(party_a.calls)) == 2 + 2 * 2 * 2  # nothing ran twice
    assert sum(1 for c in party_a.calls if c[0] == "none") == 2  # ∞: once per seed, not once per mode
    assert len(rows) == 10 and len(table.read_rows(out / "results.csv")) == 10
    again = table.run_label_table(_base(), "toy", EPSILONS, ["rr", "pate"], 2, out, [party_a],
                                  _console(tmp_path), truth=_truth)
    assert len(party_a.calls) == 10 and {r.key for r in again} == {r.key for r in rows}  # complete: nothing runs

    # the CSV holds the measurement: rr rows attacked on B's training nodes, pate rows on none
    by_key = {r.key: r for r in table.read_rows(out / "results.csv")}
    rr = by_key[("toy", "rr", 4.0, 1)]
    assert (rr.gradient_rows, rr.private_rows, rr.task) == (400, 400, "binary")
    assert 0.5 < rr.direction_auc_last <= 1 and rr.ceiling == pytest.approx(auc_ceiling(4.0, 1e-5))
    pate = by_key[("toy", "pate", 1.0, 0)]
    assert (pate.gradient_rows, pate.private_rows) == (60, 0)
    assert pate.norm_auc_last is None and pate.direction_auc_last is None and pate.test is not None
    assert math.isinf(by_key[("toy", "none", math.inf, 0)].label_epsilon)

    report = table.markdown(rows, EPSILONS, ["rr", "pate"], _context())
    lines = report.splitlines()
    rr_cell = [by_key[("toy", "rr", 1.0, s)] for s in (0, 1)]
    best = max(
        (statistics.fmean(getattr(r, c) for r in rr_cell), statistics.stdev(getattr(r, c) for r in rr_cell))
        for c in table.BINARY_COLUMNS
    )
    row_1 = next(line for line in lines if line.startswith("| 1 |"))
    assert f"{best[0]:.3f} ± {best[1]:.3f} (ceiling {auc_ceiling(1.0, 1e-5):.4f})" in row_1
    assert f"{table.NO_PRIVATE_GRADIENT} (0 of 60 gradient rows)" in row_1
    tests = [by_key[("toy", "rr", 1.0, s)].test for s in (0, 1)]
    assert f"{statistics.fmean(tests):.4f} ± {statistics.stdev(tests):.4f}" in row_1
    row_inf = next(line for line in lines if line.startswith("| ∞ |"))
    reference = [by_key[("toy", "none", math.inf, s)] for s in (0, 1)]
    ref_best = max(statistics.fmean(getattr(r, c) for r in reference) for c in table.BINARY_COLUMNS)
    assert row_inf.count(f"{ref_best:.3f} ± ") == 2  # the same runs in both modes' columns
    assert not any(table.ABOVE_MARK in line for line in lines if line.startswith("| "))
    assert "no cell exceeds its DP ceiling by more than 3 standard errors" in report
    assert "it grows with ε at every step" in report
    assert f"at ε = 1, 4 {table.NO_PRIVATE_GRADIENT}: its gradients are for 60 answered query node(s)" in report
    assert "Generated by `vesper bench label-privacy --dataset toy`" in report and "edge ε = ∞" in report
    table.plot(rows, EPSILONS, ["rr", "pate"], out / "results.png")
    assert (out / "results.png").stat().st_size > 10_000


def test_a_mechanism_weaker_than_its_ledger_is_flagged_above_the_ceiling(tmp_path: Path) -> None:
    """B 'randomises' nothing but its ledger says ε = 1: the attack sits far above e/(1+e)."""
    party_a = FakePartyA(tmp_path / "party_a", leak=True)
    rows = table.run_label_table(_base(), "toy", [1.0], ["rr"], 3, tmp_path / "bench", [party_a],
                                 _console(tmp_path), truth=_truth)
    cell = table.cell_of(rows, "rr", 1.0)
    assert cell is not None and cell.above_ceiling()
    report = table.markdown(rows, [1.0], ["rr"], _context(3))
    row = next(line for line in report.splitlines() if line.startswith("| 1 |"))
    assert f"(ceiling {auc_ceiling(1.0, 1e-5):.4f}, {table.ABOVE_MARK})" in row
    assert "the attack exceeds the DP ceiling" in report


def test_the_reading_follows_the_numbers_not_a_template(tmp_path: Path) -> None:
    rows = table.run_label_table(_base(), "toy", EPSILONS, ["rr"], 2, tmp_path / "bench", [FakePartyA(tmp_path / "a")],
                                 _console(tmp_path), truth=_truth)
    high = [r for r in rows if r.mode == "rr" and r.label_epsilon == 4.0]
    # make ε = 4 look worse for the attacker than ε = 1: the sentence must change with it
    flipped = [r.model_copy(update={c: 0.55 for c in table.BINARY_COLUMNS}) if r in high else r for r in rows]
    assert "it grows with ε at every step" in table.markdown(rows, EPSILONS, ["rr"], _context())
    assert "it does not grow monotonically with ε" in table.markdown(flipped, EPSILONS, ["rr"], _context())
    assert "0.550 at ε = 4" in table.markdown(flipped, EPSILONS, ["rr"], _context())


def test_a_run_without_recorded_gradients_is_not_counted_as_done(tmp_path: Path) -> None:
    party_a = FakePartyA(tmp_path / "a", record=False)
    out = tmp_path / "bench"
    rows = table.run_label_table(_base(), "toy", [2.0], ["rr", "pate"], 1, out, [party_a], _console(tmp_path), truth=_truth)
    by_mode = {r.mode: r for r in rows}
    assert by_mode["rr"].status == "no-gradients" and "recorded no gradients" in by_mode["rr"].message
    assert by_mode["pate"].status == "completed" and by_mode["pate"].gradient_rows == 0  # A got none at all
    table.run_label_table(_base(), "toy", [2.0], ["rr", "pate"], 1, out, [party_a], _console(tmp_path), truth=_truth)
    assert party_a.calls.count(("rr", 2.0, 0)) == 2 and party_a.calls.count(("pate", 2.0, 0)) == 1
    assert "## Runs that did not complete" in table.markdown(rows, [2.0], ["rr", "pate"], _context(1))


def test_multiclass_cells_on_the_bundled_cora_labels(tmp_path: Path) -> None:
    """The default truth: Cora's labels and B's label-independent split; clusters of (G1)-like gradients."""
    config = table.cell_config(_base(), "cora", "rr", 8.0, 0)
    truth = table.true_labels(config)
    assert truth.labels.size == 2708 and truth.private_ids.size == round(0.5 * 2708)

    def drive(run: RunConfig) -> tuple[RunSummary, Path | None]:
        ids = table.true_labels(run).private_ids
        rng = np.random.default_rng(run.seed)
        axes = np.eye(7, 16)
        gradients = (-axes[truth.labels[ids]] + 0.3 * rng.normal(size=(ids.size, 16))).astype(np.float32)
        path = tmp_path / f"{run.label_privacy.mode}-{run.seed}.npz"
        np.savez(path, node_ids=ids, gradients=gradients, first_gradients=gradients, num_classes=np.int64(7))
        private = run.label_privacy.mode != "none"
        return RunSummary(
            run_id=f"r{run.seed}", status="completed", dataset="cora", extractor="mlp", decoder="concat",
            accounting="visible-batch", epsilon_budget=math.inf, epsilon_spent=math.inf, delta=1e-4,
            test_metric=Metric(name="accuracy", value=0.7), label_privacy=run.label_privacy.mode,
            label_epsilon_spent=8.0 if private else None, label_delta=1e-5 if private else None,
        ), path

    rows = table.run_label_table(_base(), "cora", [8.0, math.inf], ["rr"], 1, tmp_path / "bench", [drive],
                                 _console(tmp_path))
    rr = next(r for r in rows if r.mode == "rr")
    assert rr.task == "multiclass" and rr.cluster_accuracy_last > 0.9 and rr.matched_chance < 0.35
    assert rr.ceiling is not None and 0.9 < rr.ceiling <= 1  # ε = 8 allows almost everything
    report = table.markdown(rows, [8.0, math.inf], ["rr"], _context(1))
    assert "multi-class, 7 classes" in report and "clusters, last epoch" in report


def test_csv_round_trip_keeps_infinity_and_missing_values(tmp_path: Path) -> None:
    row = table.LabelRow(dataset="toy", mode="none", label_epsilon=math.inf, seed=0, status="completed", test=0.5)
    table.append_row(tmp_path / "r.csv", row)
    (back,) = table.read_rows(tmp_path / "r.csv")
    assert back == row and math.isinf(back.label_epsilon) and back.norm_auc_last is None and back.ceiling is None


def test_a_csv_from_an_older_version_is_migrated_not_misaligned(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("dataset,mode,label_epsilon,seed,status,test\ntoy,rr,2.0,0,completed,0.7\n")
    table.append_row(path, table.LabelRow(dataset="toy", mode="rr", label_epsilon=4.0, seed=0, status="completed"))
    old, new = table.read_rows(path)
    assert (old.label_epsilon, old.test, new.label_epsilon, new.test) == (2.0, 0.7, 4.0, None)


def test_the_command_drives_each_cluster_and_reads_gradients_from_party_a_workdir(tmp_path: Path, monkeypatch) -> None:
    """The command without services: LocalCluster and drive_run stand-ins; gradients are read
    from <cluster workdir>/party_a/runs/<run id>/gradients.npz, where party A writes them."""
    import typer
    from typer.testing import CliRunner

    from vesper.coordinator import processes, run_client

    started: list[Path] = []

    class Cluster:
        def __init__(self, workdir: Path) -> None:
            self.workdir = workdir
            self.party_a_address = str(workdir)

        def __enter__(self) -> Cluster:
            started.append(self.workdir)
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    seen: list[RunConfig] = []

    def drive_run(address: str, config: RunConfig, console: Console) -> RunSummary:
        seen.append(config)
        party_a = FakePartyA(Path(address) / "party_a" / "runs")
        summary, _ = party_a(config)
        return summary.model_copy(update={"dataset": "cora"})

    monkeypatch.setattr(processes, "LocalCluster", Cluster)
    monkeypatch.setattr(run_client, "drive_run", drive_run)
    monkeypatch.setattr(table, "true_labels", _truth)
    app = typer.Typer()
    app.command()(table.label_privacy_command)
    out = tmp_path / "bench"
    result = CliRunner().invoke(app, [
        "--dataset", "cora", "--label-epsilon", "2", "--label-epsilon", "inf", "--seeds", "1", "--epochs", "2",
        "--jobs", "2", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    assert len(started) == 2 and all(w.name.startswith("cluster-") for w in started)
    assert all(c.record_gradients and c.epochs == 2 and math.isinf(c.privacy.epsilon) for c in seen)
    assert {(c.label_privacy.mode, c.extractor.name) for c in seen} == {("none", "mlp"), ("rr", "mlp"), ("pate", "relational")}
    rows = {r.mode: r for r in table.read_rows(out / "results.csv")}
    assert rows["rr"].private_rows == 400 and rows["rr"].status == "completed"  # the file was found and read
    report = (out / "results.md").read_text()
    assert "--label-epsilon 2 --label-epsilon inf --mode rr --mode pate --seeds 1" in report
    assert (out / "results.png").is_file()
