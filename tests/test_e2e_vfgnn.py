"""VFGNN end to end: three real services on loopback, the real CLI, Cora.

What the accountant records must be exactly what docs/extractors/vfgnn.md derives
(GaussianDpEvent(z) per counted release; one counted release per pass when N_e is
finite, every release when it is not), ε must stay within the budget, and every release
B received must have been charged before it arrived.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest
from e2e import fast_run, ledger, receipts, vesper

from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e


def _train(cluster: LocalCluster, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "run.json"
    code, output = vesper("train", "--party-a", cluster.party_a_address, *flags, "--json-out", str(out))
    assert code == 0, output
    return json.loads(out.read_text())


def _counted_per_pass(rows: list[dict]) -> dict[str, list[bool]]:
    passes: dict[str, list[bool]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["seq"]):
        passes[row["pass_id"]].append(row["counted"])
    return dict(passes)


def test_one_layer_run_is_charged_once_per_pass_and_b_receives_only_charged_releases(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    summary = _train(cluster, tmp_path, *fast_run("--extractor", "vfgnn", "--epsilon", "4"))
    assert summary["status"] == "completed" and summary["extractor"] == "vfgnn"
    assert summary["privacy_unit"] == "edge" and 0 < summary["epsilon_spent"] <= 4
    z = summary["noise_multiplier"]
    assert summary["sensitivity"] == pytest.approx(2.0)  # S_pass = √(2 N_e), N_e = 2 (eqs. V5, V6)
    assert summary["noise_std"] == pytest.approx(2.0 * z) and summary["participation_bound"] == 1

    record = ledger(cluster.status_url, summary["run_id"])
    run, rows = record["run"], record["rows"]
    details = run["details"]
    assert details["edge_reach"] == 2 and details["sensitivity_form"] == "per-pass"
    # h0 and the noisy output, then the edge-free path's one MLP layer (docs/privacy.md, 2.5)
    assert details["output_layers"] == 2 + 1 and details["edge_free_layers"] == 1
    assert details["released"] == "h0, noisy output"
    for rule in run["rules"]:  # the declared event: one Gaussian of multiplier z per counted release
        event = json.loads(rule["release_event"])
        assert event["type"] == "GaussianDpEvent" and event["noise_multiplier"] == pytest.approx(z)
        assert rule["participation_bound"] == 1
    passes = _counted_per_pass(rows)
    assert set(passes) == {"train-0", "train-1", "eval-0"}
    assert passes["train-0"] == passes["train-1"] == [True] + [False] * 5  # 6 steps, the first counted
    assert passes["eval-0"][0] and not any(passes["eval-0"][1:])

    code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
    assert code == 0 and f"= {summary['epsilon_spent']!r}" in output, output

    # write-ahead: every release B received was charged before B received it
    charged_at = {
        row["release_key"]: datetime.fromisoformat(row["created_at"]).timestamp() for row in rows
    }
    received = receipts(cluster.workdir / "receipts.jsonl", summary["run_id"])
    train = [r for r in received if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(summary["steps"])) and summary["steps"] == 12
    for entry in train:
        key = f"train-{entry['step'] // 6}/{entry['step'] % 6}"
        assert charged_at[key] <= entry["received_at"], key
    evaluated = [r for r in received if r["kind"] == "eval"]
    assert len(evaluated) == len(passes["eval-0"])
    assert max(charged_at.values()) <= max(r["received_at"] for r in received)


@pytest.mark.parametrize(
    "flags, bound, reach, sensitivity",
    [
        # raw graph, L = 2: N_e unbounded, every release counts, S_step = √(2 · 256) (eq. V7)
        (("--layers", "2"), None, None, math.sqrt(2 * 256)),
        # projection D = 3, L = 2: N_e = 4D = 12 roots, S_pass = √24, one counted release per pass (V6)
        (("--layers", "2", "--degree-bound", "3", "--fanout", "0"), 1, 12, math.sqrt(24)),
    ],
    ids=["raw", "projected"],
)
def test_two_layers_count_what_n_e_allows(
    cluster: LocalCluster, tmp_path: Path, flags, bound, reach, sensitivity
) -> None:
    summary = _train(cluster, tmp_path, "--dataset", "cora", "--epochs", "1", "--extractor", "vfgnn",
                     "--epsilon", "4", "-p", "self_slice=false", *flags)
    assert summary["status"] == "completed" and 0 < summary["epsilon_spent"] <= 4
    assert summary["sensitivity"] == pytest.approx(sensitivity) and summary["participation_bound"] == bound
    record = ledger(cluster.status_url, summary["run_id"])
    details = record["run"]["details"]
    assert details["edge_reach"] == reach and details["output_layers"] - details["edge_free_layers"] == 1
    assert all(rule["participation_bound"] == bound for rule in record["run"]["rules"])
    for pass_id, counted in _counted_per_pass(record["rows"]).items():
        expected = len(counted) if bound is None else min(bound, len(counted))
        assert counted == [True] * expected + [False] * (len(counted) - expected), pass_id


def test_unknown_parameters_and_hidden_batch_without_amplification_are_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    # party A refuses unknown parameters before the run starts: no run, no summary
    code, output = vesper("train", "--party-a", cluster.party_a_address,
                          *fast_run("--extractor", "vfgnn", "--epsilon", "4", "-p", "aggregation=max"))
    assert code == 1 and "INVALID_ARGUMENT" in output and "bad parameters for extractor vfgnn" in " ".join(output.split())
    for flags, message in (
        # one batch holds every training root: γ = 1, nothing to amplify (docs/extractors/vfgnn.md, 5.3)
        (("--accounting", "hidden-batch", "--batch-size", "4096"), "amplifies nothing; use visible-batch"),
    ):
        out = tmp_path / "run.json"
        code, output = vesper("train", "--party-a", cluster.party_a_address,
                              *fast_run("--extractor", "vfgnn", "--epsilon", "4", *flags), "--json-out", str(out))
        summary = json.loads(out.read_text())
        assert code != 0 and summary["status"] == "failed" and message in summary["message"], output
        assert summary["steps"] == 0 and summary["epsilon_spent"] == 0
