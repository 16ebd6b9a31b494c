"""``vesper bench utility``: the grid's sharing rules, resuming, old CSVs, synthetic specs,
the findings' decisions, the report files, and one run of the command through the services."""

from __future__ import annotations

import csv
import math
import statistics
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from vesper.benchmarks import extractor_sweep as sweep
from vesper.benchmarks import findings
from vesper.benchmarks import utility_bench as bench
from vesper.benchmarks.extractor_table import TableRow, append_row, read_rows, row_of
from vesper.common.config import Metric, RunConfig, RunSummary

TRAITS = {
    "mlp": sweep.ExtractorTraits(name="mlp", cost_model="none"),
    "pmp-gin": sweep.ExtractorTraits(name="pmp-gin", cost_model="per-step"),
    "pmp-gcn": sweep.ExtractorTraits(name="pmp-gcn", cost_model="per-step"),
    "gap": sweep.ExtractorTraits(name="gap", cost_model="one-shot"),  # declares both; charges both alike
    "dpar-edge": sweep.ExtractorTraits(name="dpar-edge", cost_model="one-shot", accountings=("visible-batch",)),
    "vfgnn": sweep.ExtractorTraits(name="vfgnn", cost_model="per-step", accountings=("visible-batch",)),
    "heterpoisson": sweep.ExtractorTraits(
        name="heterpoisson", privacy_unit="node", cost_model="per-step", accountings=("visible-batch",)
    ),
}
BOTH = ("hidden-batch", "visible-batch")


def traits(name: str) -> sweep.ExtractorTraits:
    return TRAITS[name]


def quiet(tmp_path: Path) -> Console:
    return Console(file=open(tmp_path / "log.txt", "a"), width=200)


# -- the grid ---------------------------------------------------------------------------------------
def test_mlp_and_infinity_share_runs_and_unsupported_cells_are_not_run() -> None:
    cells = sweep.grid_cells(["cora"], list(TRAITS), ["concat", "gru"], BOTH, [1.0, 4.0, math.inf], 2)
    plan = sweep.plan_grid(cells, [], traits)
    assert len(cells) == 7 * 2 * 2 * 3 * 2
    runs = {(r.extractor, r.decoder, r.accounting, r.epsilon, r.seed) for r in plan.runs}
    assert len(runs) == len(plan.runs) == len(plan.missing)
    per_decoder_seed = {
        "mlp": 1,  # every ε, both modes
        "pmp-gin": 2 * 2 + 1, "pmp-gcn": 2 * 2 + 1,  # finite ε per mode, ∞ once
        "gap": 2 + 1, "dpar-edge": 2 + 1,  # one-shot: its visible-batch runs serve hidden-batch
        "vfgnn": 2 + 1, "heterpoisson": 2 + 1,  # no hidden-batch: its finite hidden cells are not run
    }
    for name, count in per_decoder_seed.items():
        assert sum(r.extractor == name for r in plan.runs) == count * 2 * 2, name
    assert all(r.accounting == "visible-batch" for r in plan.runs if r.extractor == "mlp" or math.isinf(r.epsilon))
    assert {(c.extractor, c.accounting) for c in plan.unsupported} == {
        ("vfgnn", "hidden-batch"), ("heterpoisson", "hidden-batch")
    }
    assert all(math.isfinite(c.epsilon) for c in plan.unsupported)


@settings(max_examples=60, deadline=None)
@given(
    extractors=st.lists(st.sampled_from(list(TRAITS)), min_size=1, max_size=6, unique=True),
    epsilons=st.lists(st.sampled_from([1.0, 2.0, 4.0, 16.0, math.inf]), min_size=1, max_size=5, unique=True),
    accountings=st.lists(st.sampled_from(BOTH), min_size=1, max_size=2, unique=True),
    decoders=st.lists(st.sampled_from(["concat", "gru"]), min_size=1, max_size=2, unique=True),
    seeds=st.integers(1, 3),
)
def test_every_supported_cell_is_served_by_exactly_one_run(
    extractors: list[str], epsilons: list[float], accountings: list[str], decoders: list[str], seeds: int,
) -> None:
    cells = sweep.grid_cells(["cora", "x.npz"], extractors, decoders, accountings, epsilons, seeds)
    plan = sweep.plan_grid(cells, [], traits)
    keys = [sweep.cell_serve_key(r, traits) for r in plan.runs]
    assert len(set(keys)) == len(keys)
    unsupported = set(plan.unsupported)
    for cell in cells:
        if cell in unsupported:
            assert cell.accounting not in TRAITS[cell.extractor].accountings and math.isfinite(cell.epsilon)
        else:
            assert sweep.cell_serve_key(cell, traits) in keys
    finite = sum(math.isfinite(e) for e in epsilons)
    expected = 0
    for name in extractors:
        t = TRAITS[name]
        if t.reads_no_edges:
            expected += 1
            continue
        modes = 1 if t.accounting_free else sum(a in t.accountings for a in accountings)
        expected += finite * modes + (math.inf in epsilons)
    assert len(plan.runs) == expected * 2 * len(decoders) * seeds


def _row(extractor: str, accounting: str, epsilon: float, seed: int, test: float, **extra: object) -> TableRow:
    return TableRow(
        dataset="cora", extractor=extractor, seed=seed, epsilon_budget=epsilon, accounting=accounting,
        status="completed", metric="accuracy", test=test, **extra,
    )


def test_an_infinite_budget_row_serves_both_modes_only_without_noise() -> None:
    cell = sweep.GridCell("cora", "pmp-gcn", "concat", "hidden-batch", math.inf, 0)
    clean = _row("pmp-gcn", "visible-batch", math.inf, 0, 0.8, noise_multiplier=None)
    noisy = _row("pmp-gcn", "visible-batch", math.inf, 0, 0.8, noise_multiplier=0.7)
    assert sweep.plan_grid([cell], [clean], traits).done == [clean]
    twice = sweep.served_cell([clean, clean], "cora", "pmp-gcn", "concat", "hidden-batch", math.inf, traits)
    assert twice is not None and twice.values == [0.8]  # a seed counts once
    plan = sweep.plan_grid([cell], [noisy], traits)
    assert plan.done == [] and plan.missing == [cell._replace(accounting="visible-batch")]
    assert sweep.served_cell([noisy], "cora", "pmp-gcn", "concat", "hidden-batch", math.inf, traits) is None


# -- runs, resuming, old files ------------------------------------------------------------------------
def _score(config: RunConfig) -> float:
    bonus = {"mlp": 0.0, "pmp-gcn": 0.02, "pmp-gin": 0.01, "gap": 0.03, "vfgnn": -0.01}[config.extractor.name]
    eps = config.privacy.epsilon
    return 0.7 + bonus * (1 if math.isinf(eps) else min(eps, 16) / 16) + 0.001 * config.seed


def _summary(config: RunConfig) -> RunSummary:
    name, eps = config.extractor.name, config.privacy.epsilon
    return RunSummary(
        run_id=f"{name}-{config.seed}-{eps}-{config.privacy.accounting}-{config.decoder.kind}", status="completed",
        dataset=config.dataset, extractor=name, decoder=config.decoder.kind, accounting=config.privacy.accounting,
        epsilon_budget=eps, epsilon_spent=0.0 if name == "mlp" else (math.inf if math.isinf(eps) else eps * 0.99),
        delta=1e-4, test_metric=Metric(name="accuracy", value=_score(config)), seconds=2.0,
        noise_multiplier=None if name == "mlp" or math.isinf(eps) else 1.0,
    )


def _options(tmp_path: Path, **update: object) -> bench.UtilityOptions:
    values: dict[str, object] = {
        "datasets": ["cora"], "extractors": ["mlp", "pmp-gcn", "gap", "vfgnn"], "decoders": ["concat"],
        "epsilons": [4.0, math.inf], "accountings": list(BOTH), "seeds": 2,
        "base": RunConfig.model_validate({"epochs": 3}), "out": tmp_path / "bench",
    }
    values.update(update)
    return bench.UtilityOptions.model_validate(values)


def test_a_killed_benchmark_resumes_with_only_the_missing_runs(tmp_path: Path) -> None:
    options = _options(tmp_path)
    calls: list[tuple] = []
    budget = [5]

    def drive(config: RunConfig) -> RunSummary:
        if budget[0] == 0:
            raise KeyboardInterrupt  # killed mid-way
        budget[0] -= 1
        calls.append((config.extractor.name, config.privacy.accounting, config.privacy.epsilon, config.seed))
        return _summary(config)

    with pytest.raises(KeyboardInterrupt):
        bench.run_utility(options, quiet(tmp_path), drivers=[drive], traits=traits)
    first = list(calls)
    assert len(read_rows(options.out / "results.csv")) == 5
    budget[0] = 100
    run = bench.run_utility(options, quiet(tmp_path), drivers=[drive], traits=traits)
    # mlp 2, pmp-gcn (4 per mode + ∞) 3 × 2, gap (4 + ∞) 2 × 2, vfgnn (4 visible + ∞) 2 × 2
    assert len(calls) == 2 + 6 + 4 + 4 and len(set(calls)) == len(calls) and calls[:5] == first
    assert len(run.rows) == 16 and len(run.plan.done) == 5
    log = (tmp_path / "log.txt").read_text()
    assert "16 runs: 5 done, 11 to run" in log and "estimated time left" in log
    again = bench.run_utility(options, quiet(tmp_path), drivers=[drive], traits=traits)
    assert len(calls) == 16 and len(again.rows) == 16  # complete: nothing runs


def test_completed_runs_that_share_a_key_are_kept_when_other_cells_run(tmp_path: Path) -> None:
    """Runs of another day merged into the file (more MLP seeds) are not dropped as 'superseded'
    by a later invocation that runs other cells; a cell it runs again after a failure is listed once."""
    options = _options(tmp_path, extractors=["mlp", "pmp-gcn"], accountings=["visible-batch"], epsilons=[4.0])
    options.out.mkdir(parents=True)
    path = options.out / "results.csv"
    base = RunConfig.model_validate({
        "dataset": "cora", "epochs": 3, "seed": 0, "extractor": {"name": "mlp"},
        "privacy": {"epsilon": 4.0, "accounting": "visible-batch"},
    })
    for day in ("monday", "tuesday"):  # the same key, two completed runs
        append_row(path, row_of(_summary(base).model_copy(update={"run_id": f"mlp-0-{day}"}), "cora", 0))
    failed = base.model_copy(update={"extractor": base.extractor.model_copy(update={"name": "pmp-gcn"})})
    append_row(path, row_of(_summary(failed).model_copy(update={"status": "failed", "run_id": ""}), "cora", 0))

    bench.run_utility(options, quiet(tmp_path), drivers=[_summary], traits=traits)

    rows = read_rows(path)
    assert sorted(r.run_id for r in rows if r.extractor == "mlp" and r.seed == 0) == ["mlp-0-monday", "mlp-0-tuesday"]
    pmp0 = [r for r in rows if r.extractor == "pmp-gcn" and r.seed == 0]
    assert [r.status for r in pmp0] == ["completed"]  # the failure it ran again is gone

def test_an_old_csv_without_decoder_reads_as_concat_and_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    old = ["dataset", "extractor", "seed", "epsilon_budget", "accounting", "status", "metric", "test", "val",
           "epsilon_spent", "privacy_unit", "seconds", "run_id", "message"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(old)
        writer.writerow(["cora", "mlp", 0, 4.0, "visible-batch", "completed", "accuracy", 0.74, "", 0, "edge", 7, "r1",
                         ""])
        writer.writerow(["cora", "gap", 0, "inf", "visible-batch", "completed", "accuracy", 0.81, 0.8, "inf", "edge",
                         9, "r2", ""])
    rows = read_rows(path)
    assert [r.decoder for r in rows] == ["concat", "concat"] and rows[0].val is None
    assert math.isinf(rows[1].epsilon_budget) and rows[1].noise_multiplier is None
    append_row(path, _row("pmp-gcn", "hidden-batch", 4.0, 0, 0.7, decoder="gru", noise_multiplier=0.9))
    again = read_rows(path)
    assert [(r.extractor, r.decoder) for r in again] == [("mlp", "concat"), ("gap", "concat"), ("pmp-gcn", "gru")]
    assert again[2].noise_multiplier == 0.9 and again[0].test == 0.74
    plan = sweep.plan_grid(sweep.grid_cells(["cora"], ["mlp"], ["concat"], BOTH, [1.0, 8.0], 1), again, traits)
    assert plan.missing == [] and plan.done == [again[0]]  # the old MLP row serves every ε and mode


# -- synthetic datasets -------------------------------------------------------------------------------
def test_synthetic_graphs_are_deterministic_and_a_other_spec_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = bench.ensure_synthetic(data, "synthetic-sparse", 300, set())
    digest = bench.array_digest(path)
    with np.load(path) as first:
        arrays = {name: first[name] for name in first.files}
    path.unlink()
    assert bench.ensure_synthetic(data, "synthetic-sparse", 300, set()) == path  # regenerated: the same arrays
    assert bench.array_digest(path) == digest
    with np.load(path) as second:
        assert all(np.array_equal(arrays[name], second[name]) for name in second.files)
    with pytest.raises(bench.SpecMismatch, match=r"num_nodes: recorded 300, asked 400.*--synthetic-nodes 300"):
        bench.ensure_synthetic(data, "synthetic-sparse", 400, set())
    with pytest.raises(bench.SpecMismatch, match="does not record the spec"):
        bench.ensure_synthetic(data, "synthetic-dense", 300, {"synthetic-dense"})
    with np.load(path) as archive:
        changed = {name: archive[name] for name in archive.files}
    changed["node_labels"] = 1 - changed["node_labels"]
    np.savez(path, **changed)
    with pytest.raises(bench.SpecMismatch, match="not the ones"):
        bench.ensure_synthetic(data, "synthetic-sparse", 300, set())



def test_the_100k_graphs_keep_their_own_size_and_are_generated_like_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vesper.benchmarks import utility_datasets

    for label, profile in (("synthetic-dense-100k", "dense"), ("synthetic-sparse-100k", "sparse")):
        spec = bench.synthetic_spec(label, 2708)
        assert (spec.num_nodes, spec.profile, spec.homophily, spec.seed) == (100_000, profile, 0.8, 0)
        assert label not in bench.FULL.datasets  # minutes per run: asked for by name only
    # the same path as the real ones, at a size a test can afford: --synthetic-nodes does not apply
    monkeypatch.setitem(utility_datasets.SYNTHETIC_FIXED, "synthetic-dense-100k", ("dense", 0.8, 300))
    found = bench.resolve_datasets(["synthetic-dense-100k", "synthetic-sparse"], tmp_path, 400, set(), quiet(tmp_path))
    assert [d.label for d in found] == ["synthetic-dense-100k", "synthetic-sparse"]
    with np.load(found[0].path) as fixed, np.load(found[1].path) as scaled:
        assert fixed["node_labels"].size == 300 and scaled["node_labels"].size == 400
    assert bench.synthetic_spec("synthetic-dense-100k", 5000).num_nodes == 300

# -- findings -----------------------------------------------------------------------------------------
DENSE = findings.GraphDensity(dataset="dense", nodes=100, edges=1000)  # mean degree 20 > ln 100
SPARSE = findings.GraphDensity(dataset="sparse", nodes=1000, edges=1000)  # 2 < ln 1000


def _rows(dataset: str, extractor: str, accounting: str, epsilon: float, values: list[float]) -> list[TableRow]:
    return [
        TableRow(dataset=dataset, extractor=extractor, seed=seed, epsilon_budget=epsilon, accounting=accounting,
                 status="completed", metric="accuracy", test=value, epsilon_spent=0 if extractor == "mlp" else epsilon)
        for seed, value in enumerate(values)
    ]


HIGH, MID, LOW = [0.800, 0.802, 0.804], [0.750, 0.752, 0.754], [0.700, 0.702, 0.704]


def _verdicts(rows: list[TableRow], key: str, accounting: str = "visible-batch") -> dict[str, findings.DatasetVerdict]:
    found = findings.decide(rows, {"dense": DENSE, "sparse": SPARSE}, traits=traits, accountings=[accounting])
    finding = next(f for f in found if f.key == key)
    return {v.dataset: v for v in finding.datasets}


def test_finding_a_holds_fails_and_is_not_measured() -> None:
    rows = (_rows("dense", "pmp-gcn", "visible-batch", 4, HIGH) + _rows("dense", "mlp", "visible-batch", 8, MID)
            + _rows("sparse", "pmp-gcn", "visible-batch", 4, LOW) + _rows("sparse", "mlp", "visible-batch", 8, MID))
    verdicts = _verdicts(rows, "a")
    assert verdicts["dense"].outcome == "holds" and verdicts["sparse"].outcome == "does not hold"
    comparison = verdicts["dense"].comparisons[0]
    assert comparison.difference == pytest.approx(0.05) and comparison.test.p < 0.05
    hidden = _verdicts(rows, "a", "hidden-batch")  # the MLP row serves it, pmp-gcn has no hidden-batch run
    assert hidden["dense"].outcome == "not measured" and "pmp-gcn at ε = 4" in hidden["dense"].comparisons[0].reason
    one_seed = _rows("dense", "pmp-gcn", "visible-batch", 4, HIGH[:1]) + _rows("dense", "mlp", "visible-batch", 4, MID)
    assert _verdicts(one_seed, "a")["dense"].outcome == "not measured"


def test_beats_means_p_below_five_percent_not_a_higher_mean() -> None:
    mlp = _rows("dense", "mlp", "visible-batch", 4, [0.72, 0.73, 0.74])
    clear = _verdicts(mlp + _rows("dense", "pmp-gcn", "visible-batch", 4, [0.76, 0.78, 0.80]), "a")["dense"]
    assert clear.outcome == "holds" and 0.01 < clear.comparisons[0].test.p < 0.05
    noisy = _verdicts(mlp + _rows("dense", "pmp-gcn", "visible-batch", 4, [0.70, 0.76, 0.76]), "a")["dense"]
    assert noisy.comparisons[0].difference > 0 and 0.05 < noisy.comparisons[0].test.p < 0.5
    assert noisy.outcome == "does not hold"


def test_finding_b_depends_on_density() -> None:
    holds = (_rows("dense", "pmp-gin", "visible-batch", 4, HIGH) + _rows("dense", "pmp-gcn", "visible-batch", 4, MID)
             + _rows("sparse", "pmp-gcn", "visible-batch", 4, HIGH)
             + _rows("sparse", "pmp-gin", "visible-batch", 4, MID))
    verdicts = _verdicts(holds, "b")
    assert verdicts["dense"].outcome == verdicts["sparse"].outcome == "holds"
    assert verdicts["sparse"].comparisons[0].first.extractor == "pmp-gcn"
    swapped = [r.model_copy(update={"dataset": "sparse" if r.dataset == "dense" else "dense"}) for r in holds]
    assert {v.outcome for v in _verdicts(swapped, "b").values()} == {"does not hold"}
    assert _verdicts(holds[:3], "b")["sparse"].outcome == "not measured"


def test_finding_c_picks_the_better_vesper_extractor_and_chains_the_comparisons() -> None:
    base = (_rows("dense", "pmp-gin", "visible-batch", 4, HIGH) + _rows("dense", "pmp-gcn", "visible-batch", 4, LOW)
            + _rows("dense", "gap", "visible-batch", 4, MID))
    holds = _verdicts(base + _rows("dense", "vfgnn", "visible-batch", 4, LOW), "c")["dense"]
    assert holds.outcome == "holds" and "pmp-gin" in holds.note
    assert [c.first.extractor for c in holds.comparisons] == ["pmp-gin", "gap"]
    fails = _verdicts(base + _rows("dense", "vfgnn", "visible-batch", 4, HIGH), "c")["dense"]
    assert fails.outcome == "does not hold"
    # under hidden-batch GAP's visible-batch runs stand in; VFGNN has no hidden-batch accounting
    hidden_rows = [r.model_copy(update={"accounting": "hidden-batch"}) for r in base if r.extractor != "gap"]
    hidden_rows += _rows("dense", "gap", "visible-batch", 4, MID) + _rows("dense", "vfgnn", "visible-batch", 4, LOW)
    found = findings.decide(hidden_rows, {"dense": DENSE}, traits=traits, accountings=["hidden-batch"])
    c = next(f for f in found if f.key == "c")
    assert c.datasets[0].comparisons[0].outcome == "holds" and c.outcome == "not measured"
    assert "no hidden-batch accounting" in c.note and "stand in" in c.note


def test_finding_d_is_a_non_inferiority_test_on_dense_graphs() -> None:
    near = _rows("dense", "pmp-gin", "visible-batch", 16, [0.800, 0.801, 0.802])
    top = _rows("dense", "pmp-gin", "visible-batch", math.inf, [0.820, 0.821, 0.822])  # 0.02 below: within 0.03
    far = _rows("dense", "pmp-gin", "visible-batch", 16, [0.700, 0.701, 0.702])
    sparse = _rows("sparse", "pmp-gin", "visible-batch", 16, HIGH)
    sparse += _rows("sparse", "pmp-gin", "visible-batch", math.inf, HIGH)
    verdicts = _verdicts(near + top + sparse, "d")
    assert verdicts["dense"].outcome == "holds" and "sparse" not in verdicts
    assert verdicts["dense"].comparisons[0].margin == findings.NEAR_MARGIN
    assert _verdicts(far + top, "d")["dense"].outcome == "does not hold"
    assert _verdicts(near, "d")["dense"].outcome == "not measured"
    text = findings.markdown(findings.decide(near + top, {"dense": DENSE, "sparse": SPARSE}, traits=traits),
                             {"dense": DENSE, "sparse": SPARSE})
    assert "not part of the claim (sparse)" in text and "p = " in text and "(d)" in text


@settings(max_examples=40, deadline=None)
@given(
    x=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6),
    y=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6),
)
def test_welch_matches_scipy(x: list[float], y: list[float]) -> None:
    from scipy.stats import ttest_ind

    if statistics.variance(x) + statistics.variance(y) < 1e-8:
        return
    ours = findings.welch_one_sided(x, y)
    with warnings.catch_warnings():  # scipy warns when one sample is constant; its p is still exact
        warnings.simplefilter("ignore", RuntimeWarning)
        theirs = ttest_ind(x, y, equal_var=False, alternative="greater")
    assert ours.p == pytest.approx(float(theirs.pvalue), rel=1e-6, abs=1e-12)


def test_density_is_read_from_the_graph() -> None:
    from vesper.common.dataset_files import bundled_path

    cora = findings.graph_density("cora", bundled_path("cora"))
    assert cora.edges == 5278 and cora.nodes == 2708 and not cora.dense
    edges = np.array([[0, 1], [1, 0], [2, 2], [1, 2], [1, 2]])
    assert findings.simple_edge_count(edges) == 2


# -- the report ---------------------------------------------------------------------------------------
def test_report_files_are_written(tmp_path: Path) -> None:
    options = _options(tmp_path, decoders=["concat", "gru"], epsilons=[1.0, 4.0, 16.0, math.inf])
    run = bench.run_utility(options, quiet(tmp_path), drivers=[_summary], traits=traits)
    found = bench.write_report(run, options, traits=traits)
    report = (options.out / "results.md").read_text()
    assert "### cora · decoder gru · hidden-batch (test accuracy)" in report
    assert "| ε = 1 | ε = 4 | ε = 16 | ∞ (non-private) |" in report
    mlp_line = next(line for line in report.splitlines() if line.startswith("| mlp "))
    assert mlp_line.count("0.7005 ± 0.0007 (2)") == 4
    gap_hidden = report.split("### cora · decoder concat · hidden-batch")[1].split("###")[0]
    assert "0.7024 ± 0.0007 (2), ε 0.99†" in gap_hidden and "| vfgnn | edge | n/a | n/a | n/a |" in gap_hidden
    assert "## Cells not run" in report and "## VESPER's findings, reproduced" in report
    assert len(found) == 4 * 2 * 2
    for decoder in ("concat", "gru"):
        assert (options.out / "plots" / f"utility-{decoder}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command, through the services ----------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.slow  # a grid of runs through the services: make test-slow
def test_the_command_runs_a_tiny_grid_through_the_services_and_resumes(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bench.utility_command)
    out = tmp_path / "utility"
    args = ["--dataset", "cora", "--extractor", "mlp", "--extractor", "pmp-gcn", "--epsilon", "4", "--seeds", "1",
            "--epochs", "2", "--jobs", "1", "--decoder", "concat", "--accounting", "visible-batch", "--out", str(out)]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {r.extractor: r for r in read_rows(out / "results.csv")}
    assert sorted(rows) == ["mlp", "pmp-gcn"] and all(r.status == "completed" for r in rows.values()), rows
    gcn = rows["pmp-gcn"]
    assert gcn.accounting == "visible-batch" and gcn.decoder == "concat" and gcn.metric == "accuracy"
    assert 3.9 < gcn.epsilon_spent <= 4 and gcn.noise_multiplier and rows["mlp"].epsilon_spent == 0
    report = (out / "results.md").read_text()
    table = report.split("### cora · decoder concat · visible-batch (test accuracy)")[1].split("##")[0]
    assert f"| pmp-gcn | edge | {gcn.test:.4f} ± 0.0000 (1), ε {gcn.epsilon_spent:.3g} |" in table
    assert "(a) under visible-batch, decoder concat: not measured" in report  # one seed: no spread to test
    assert (out / "plots" / "utility-concat.png").stat().st_size > 10_000
    again = CliRunner().invoke(app, args, catch_exceptions=False)  # complete: no services start
    assert again.exit_code == 0 and "2 cells, served by 2 runs: 2 done, 0 to run" in again.output
    assert len(read_rows(out / "results.csv")) == 2
