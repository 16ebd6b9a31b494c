"""`vesper bench audit` and `vesper audit` through the real services (docs/audit.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vesper.benchmarks.audit_bench import AuditRow, markdown, planned_cells, read_rows
from vesper.coordinator.cli import app

runner = CliRunner()

# the audit bench trains and attacks a small grid through the services (~2 min): make test-slow
pytestmark = pytest.mark.slow


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_planned_cells_run_infinity_once() -> None:
    cells = planned_cells(["cora"], ["pmp-gcn", "gap"], ["hidden-batch", "visible-batch"], [1.0, math.inf], 2)
    assert len(cells) == 2 * (2 + 1) * 2
    assert all(mode == "visible-batch" for _, _, mode, eps, _ in cells if math.isinf(eps))


def _row(**update: object) -> AuditRow:
    base = dict(
        dataset="cora", extractor="pmp-gcn", accounting="hidden-batch", epsilon_budget=4.0, seed=0,
        status="completed", epsilon_spent=4.0, edge_auc=0.6, canaries=100, canary_guesses=20,
        canary_correct=15, canary_bound=0.3,
    )
    return AuditRow(**{**base, **update})


def test_report_says_whether_hidden_batch_survives() -> None:
    survived = markdown([_row()], ["pmp-gcn"], ["hidden-batch"], [4.0], 1, "cmd")
    assert "**Not contradicted.**" in survived and "**No.**" not in survived
    broken = markdown([_row(canary_bound=5.0)], ["pmp-gcn"], ["hidden-batch"], [4.0], 1, "cmd")
    assert "**No.** 1 of 1 hidden-batch runs" in broken
    assert "ABOVE the accountant's ε" in broken
    visible = markdown([_row(accounting="visible-batch", canary_bound=5.0)], ["pmp-gcn"], ["visible-batch"], [4.0], 1, "cmd")
    assert "a bug to investigate" in visible


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("audit")
    result = runner.invoke(app, [
        "bench", "audit", "--dataset", "cora", "--extractor", "pmp-gcn", "--epsilon", "inf",
        "--accounting", "visible-batch", "--epochs", "2", "--canaries", "200", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    return out


def test_bench_audit_writes_rows_report_and_plot(audited: Path) -> None:
    rows = read_rows(audited / "results.csv")
    assert len(rows) == 1
    row = rows[0]
    assert row.status == "completed" and row.epsilon_budget == math.inf
    assert row.canaries == 200 and row.canary_guesses > 0 and row.canary_bound is not None
    assert row.edge_auc is not None and row.membership_auc is not None and row.membership_run_id
    report = (audited / "results.md").read_text()
    assert "## Empirical privacy audit" in report and "| pmp-gcn | either (no noise) | ∞ |" in report
    assert (audited / "attack-auc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_audit_resumes_without_running_again(audited: Path) -> None:
    result = runner.invoke(app, [
        "bench", "audit", "--dataset", "cora", "--extractor", "pmp-gcn", "--epsilon", "inf",
        "--accounting", "visible-batch", "--epochs", "2", "--canaries", "200", "--out", str(audited),
    ])
    assert result.exit_code == 0, result.output
    assert "1 cells, 1 already done" in _flat(result.output)
    assert len(read_rows(audited / "results.csv")) == 1


def test_vesper_audit_reports_every_attack(audited: Path) -> None:
    row = read_rows(audited / "results.csv")[0]
    workdir = audited / "cluster-0"
    args = ["--party-a-workdir", str(workdir / "party_a"), "--party-b-workdir", str(workdir / "party_b")]
    result = runner.invoke(app, ["audit", row.run_id, *args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["canaries"]["m"] == 200 and report["edge_inference"]["auc"] == pytest.approx(row.edge_auc)
    assert report["membership"] is None and any("membership" in s for s in report["skipped"])
    tfts = runner.invoke(app, ["audit", row.membership_run_id, *args], env={"COLUMNS": "200"})
    assert tfts.exit_code == 0, tfts.output
    assert "membership" in tfts.output and "no canary audit" in tfts.output


def test_vesper_audit_names_what_is_missing(audited: Path, tmp_path: Path) -> None:
    workdir = audited / "cluster-0"
    unknown = runner.invoke(app, [
        "audit", "0123456789ab", "--party-a-workdir", str(workdir / "party_a"), "--party-b-workdir", str(workdir / "party_b"),
    ])
    assert unknown.exit_code == 1 and "no run '0123456789ab'" in _flat(unknown.output)
    row = read_rows(audited / "results.csv")[0]
    nothing = runner.invoke(app, [
        "audit", row.run_id, "--party-a-workdir", str(workdir / "party_a"), "--party-b-workdir", str(tmp_path),
    ])
    assert nothing.exit_code == 1 and "audit.record_releases" in _flat(nothing.output)


def test_rescore_runs_the_attacks_again_without_training(audited: Path) -> None:
    before = read_rows(audited / "results.csv")[0]
    result = runner.invoke(app, [
        "bench", "audit", "--dataset", "cora", "--extractor", "pmp-gcn", "--epsilon", "inf",
        "--accounting", "visible-batch", "--epochs", "2", "--canaries", "200", "--confidence", "0.9",
        "--rescore", "--out", str(audited),
    ])
    assert result.exit_code == 0, result.output
    after = read_rows(audited / "results.csv")
    assert len(after) == 1 and after[0].run_id == before.run_id and after[0].confidence == 0.9
    assert after[0].edge_auc == pytest.approx(before.edge_auc)  # same record, same seed
    assert after[0].mechanism_bound is not None and after[0].mechanism_bound >= before.mechanism_bound
