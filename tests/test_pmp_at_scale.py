"""``benchmarks.pmp_at_scale``: the kept CSV is the benchmarks' rows with their setting, and each
group is tested against its own dataset's MLP."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vesper.benchmarks import pmp_at_scale as scale

FIELDS = ["dataset", "extractor", "decoder", "seed", "epsilon_budget", "accounting", "status", "metric", "test",
          "val", "epsilon_spent", "privacy_unit", "noise_multiplier", "seconds", "run_id", "message", "head"]


def _results(out: Path, rows: list[tuple[str, str, str, int, float, str]]) -> Path:
    out.mkdir(parents=True)
    with (out / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for dataset, extractor, accounting, seed, test, status in rows:
            writer.writerow({
                "dataset": dataset, "extractor": extractor, "decoder": "concat", "seed": seed, "epsilon_budget": 4,
                "accounting": accounting, "status": status, "metric": "roc_auc", "test": test, "val": test,
                "epsilon_spent": 0 if extractor == "mlp" else 4, "privacy_unit": "edge",
                "noise_multiplier": "" if extractor == "mlp" else 1.5, "seconds": 1, "run_id": f"r{seed}",
                "message": "", "head": "",
            })
    return out


def test_groups_are_tested_against_their_own_datasets_mlp(tmp_path: Path) -> None:
    charged = _results(tmp_path / "a", [
        ("dense", "mlp", "visible-batch", 0, 0.80, "completed"), ("dense", "mlp", "visible-batch", 1, 0.81, "completed"),
        ("dense", "pmp-gcn", "hidden-batch", 0, 0.90, "completed"),
        ("dense", "pmp-gcn", "hidden-batch", 1, 0.91, "completed"),
        ("dense", "pmp-gcn", "hidden-batch", 2, 0.10, "failed"),  # not a result
        ("sparse", "mlp", "visible-batch", 0, 0.95, "completed"), ("sparse", "mlp", "visible-batch", 1, 0.96, "completed"),
        ("sparse", "pmp-gcn", "hidden-batch", 0, 0.90, "completed"),
        ("sparse", "pmp-gcn", "hidden-batch", 1, 0.91, "completed"),
    ])
    ablation = _results(tmp_path / "b", [("dense", "pmp-gcn", "hidden-batch", 0, 0.99, "completed")])
    kept = tmp_path / "kept.csv"
    scale.combine(kept, {"as-charged": charged, "low-noise": ablation})
    found = {(g.setting, g.dataset, g.extractor): g for g in scale.groups(scale.read_runs(kept))}
    dense = found[("as-charged", "dense", "pmp-gcn")]
    assert dense.values == [0.90, 0.91] and dense.noise_multipliers == [1.5, 1.5]
    assert dense.p_above_mlp is not None and dense.p_above_mlp < 0.05
    sparse = found[("as-charged", "sparse", "pmp-gcn")]
    assert sparse.p_above_mlp is not None and sparse.p_above_mlp > 0.95  # below the MLP: far from "above"
    assert found[("low-noise", "dense", "pmp-gcn")].p_above_mlp is None  # one run: no spread to test
    assert found[("as-charged", "dense", "mlp")].p_above_mlp is None
    table = scale.markdown(list(found.values()))
    assert "| dense | as-charged | pmp-gcn | hidden-batch | 0.9050 ± 0.0071 (2) | 1.500 |" in table


def test_a_missing_benchmark_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere/results.csv does not exist"):
        scale.combine(tmp_path / "kept.csv", {"as-charged": tmp_path / "nowhere"})
