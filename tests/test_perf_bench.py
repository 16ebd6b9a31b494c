"""`vesper bench perf` (benchmarks/perf/): pipelining is exact, the report writer, and the cheap
parts of the figure sources. The benchmark itself is never run here.

1. Pipelining (party A samples step t+1 while B computes step t) changes nothing a run
   produces: the same releases (the journal's SHA-256 of every tensor sent), the same ledger
   rows, the same summary and final parameters of both parties; and at the extractor level
   the same release sequence on random graphs, secret edge subsampling and two layers included.
2. The report: every figure with its goal and verdict, what bounds a missed goal, a source
   that is missing or fails reported instead of ending the command.
3. The measurement helpers: percentiles, steady-state rates, bytes per step, the seed-noise
   verdict, the one-process loop and in-process charges on a real ledger.
"""

from __future__ import annotations

import json
import math
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph
from rich.console import Console
from typer.testing import CliRunner

from vesper.accountant.ledger_store import LedgerStore
from vesper.benchmarks.perf import command as perf
from vesper.benchmarks.perf.accountant_latency import WARMUP, counted_split, paced_commits, percentile
from vesper.benchmarks.perf.accountant_latency import in_process as charges_in_process
from vesper.benchmarks.perf.figures import PerfFigure
from vesper.benchmarks.perf.throughput import ThroughputOptions, one_process_rate, steady_rate
from vesper.benchmarks.perf.wire_bytes import bytes_per_step, framed, within_seed_noise
from vesper.common.config import RunConfig
from vesper.coordinator.in_process import InProcessCluster
from vesper.party_a.extractors.base import ExtractorSetup
from vesper.party_a.extractors.pmp_plugin import PmpGcnPlugin, PmpGinPlugin, PmpPlugin
from vesper.party_a.run.step_timings import STEP_TIMINGS_FILE, StepTimings

VOLATILE = {"run_id", "seconds", "status_url"}


# -- 1. pipelining is exact -------------------------------------------------------------------
@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(cluster: InProcessCluster, pipelined: bool) -> tuple:
    cluster.settings_a = cluster.settings_a.model_copy(update={"pipeline": pipelined})  # read by A's next run
    config = RunConfig.model_validate({
        "dataset": "cora", "epochs": 2, "seed": 3, "privacy": {"epsilon": 4.0}, "extractor": {"name": "pmp-gcn"},
    })
    summary = cluster.drive(config)
    store = LedgerStore(cluster.ledger)
    try:
        rows = [row.model_dump(exclude={"run_id", "created_at"}) for row in store.charges(summary.run_id)]
    finally:
        store.close()
    run_a = cluster.workdir / "party_a" / "runs" / summary.run_id
    parameters = torch.load(run_a / "extractor.pt", weights_only=False)["extractor"]
    decoder = torch.load(cluster.workdir / "party_b" / "runs" / summary.run_id / "decoder.pt", weights_only=False)["decoder"]
    timings = (run_a / STEP_TIMINGS_FILE).read_text()
    return summary, rows, (run_a / "releases.jsonl").read_text(), {**parameters, **decoder}, timings


def test_pipelining_changes_no_release_no_charge_and_no_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    prefetches: list[int] = []
    prefetch = PmpPlugin.prefetch

    def counted(self: PmpPlugin, roots: torch.Tensor) -> None:
        if self.aggregates:  # the extractor's own, not its edge-free path's (which prefetches with it)
            prefetches.append(roots.numel())
        prefetch(self, roots)

    monkeypatch.setattr(PmpPlugin, "prefetch", counted)
    # checkpoints every 5 steps: the steps before them are not prefetched (their checkpoint holds
    # the sampling generator as it stands after them), the others are
    with InProcessCluster(tmp_path, party_a={"secret_seed": 7, "checkpoint_every": 5}, party_b={"secret_seed": 9}) as cluster:
        summary_s, rows_s, journal_s, parameters_s, _ = _run(cluster, False)
        assert prefetches == []
        summary_p, rows_p, journal_p, parameters_p, timings = _run(cluster, True)
    assert summary_p.status == summary_s.status == "completed"
    steps = summary_p.steps
    assert steps == 2 * math.ceil(1354 / 256)
    # every step but the last and those checkpointed (steps 5 and 10) sampled its successor ahead,
    # across the epoch boundary too
    assert len(prefetches) == steps - 1 - 2
    assert summary_p.model_dump(exclude=VOLATILE) == summary_s.model_dump(exclude=VOLATILE)
    assert journal_p == journal_s and journal_p.count("\n") == steps + 2  # every tensor sent, bit for bit
    assert rows_p == rows_s
    assert parameters_p.keys() == parameters_s.keys()
    assert all(torch.equal(parameters_p[k], parameters_s[k]) for k in parameters_p)
    assert '"prefetch"' in timings


def _plugin(cls: type, graph, layers: int, edge_rate: float | None) -> PmpPlugin:
    config = RunConfig.model_validate({
        "extractor": {"name": cls.spec.name, "layers": layers, "fanout": 3},
        "privacy": {"edge_sample_rate": edge_rate},
    })
    setup = ExtractorSetup(
        config=config, params=cls.spec.params(), graph=graph,
        features=torch.rand(graph.num_nodes, 8, generator=torch.Generator().manual_seed(0)), device=torch.device("cpu"),
        sampling_generator=torch.Generator().manual_seed(1), noise_generator=torch.Generator().manual_seed(2), delta=1e-3,
    )
    plugin = cls(setup)
    plugin.bind(1.0)
    plugin.noise_std = 0.5  # noise on, so the noise generator's order is checked too
    return plugin


@pytest.mark.parametrize(("cls", "layers", "edge_rate"), [(PmpGcnPlugin, 1, None), (PmpGinPlugin, 2, 0.4)])
def test_a_prefetched_sample_is_the_sample_the_release_would_draw(
    cls: type, layers: int, edge_rate: float | None, one_thread: None
) -> None:
    rng = random.Random(5)
    graph = random_graph(rng, 120, 0.06)
    batches = [torch.tensor(rng.sample(range(120), 17)) for _ in range(6)]
    plain, ahead = _plugin(cls, graph, layers, edge_rate), _plugin(cls, graph, layers, edge_rate)
    expected = [plain.release(batch, "train") for batch in batches]
    got = []
    for i, batch in enumerate(batches):
        got.append(ahead.release(batch, "train"))
        if i + 1 < len(batches):
            ahead.prefetch(batches[i + 1])
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    for name in ("sampling_generator", "noise_generator"):
        assert torch.equal(getattr(plain.setup, name).get_state(), getattr(ahead.setup, name).get_state())


def test_a_prefetch_out_of_order_is_refused(one_thread: None) -> None:
    graph = random_graph(random.Random(2), 60, 0.1)
    plugin = _plugin(PmpGcnPlugin, graph, 1, None)
    plugin.prefetch(torch.tensor([1, 2, 3]))
    with pytest.raises(RuntimeError, match="prefetched sample is still unused"):
        plugin.prefetch(torch.tensor([4, 5]))
    with pytest.raises(RuntimeError, match="differ from the prefetched ones"):
        plugin.release(torch.tensor([4, 5, 6]), "train")


def test_step_timings_add_up_per_phase_and_keep_a_bounded_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StepTimings, "MAX_RECORDED", 2)  # a long run keeps the first steps and the totals
    timings = StepTimings()
    for _ in range(3):
        timings.begin()
        timings.mark("release")
        timings.mark("wait")
        timings.end()
    timings.mark("release")  # outside a step: ignored
    timings.save(tmp_path / "t.json")
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["phases"] == list(StepTimings.PHASES) and len(saved["steps"]) == len(saved["ends"]) == 2
    assert saved["count"] == 3 and len(saved["totals"]) == len(StepTimings.PHASES)
    assert all(len(row) == len(StepTimings.PHASES) and min(row) >= 0 for row in saved["steps"])
    assert saved["ends"] == sorted(saved["ends"])
    assert saved["totals"][StepTimings.PHASES.index("wait")] >= sum(row[6] for row in saved["steps"]) - 1e-6


# -- 2. the report ----------------------------------------------------------------------------
def _figures() -> list[PerfFigure]:
    return [
        PerfFigure(name="ratio met", value=0.93, unit="x", measured="41.2 vs 44.3 steps/s", goal=">= 0.85",
                   passed=True, direction="higher", command="vesper bench perf --only throughput"),
        PerfFigure(name="latency missed", value=7.5, unit="ms", measured="p50 2 ms", goal="p99 < 5 ms", passed=False,
                   direction="lower", bound="cProfile of the charges:\n   ncalls  tottime\n      169    1.0 spent"),
        PerfFigure(name="reported only", value=58346.0, unit="bytes", measured="per step"),
    ]


def _report(outcomes: list[perf.SourceOutcome], quick: bool = False) -> perf.PerfReport:
    return perf.PerfReport(
        command="vesper bench perf --quick", started_at="2030-01-01 00:00 UTC", seconds=12.0,
        machine=perf.Machine.here(), load_before=(1.0, 2.0, 3.0), load_after=(1.5, 2.0, 3.0), quick=quick,
        outcomes=outcomes,
    )


def test_the_document_holds_machine_command_goals_verdicts_and_bounds(tmp_path: Path) -> None:
    report = _report([
        perf.SourceOutcome(source="throughput", what="two-party against one process", figures=_figures(), seconds=3,
                           load_before=(0.25, 0.5, 0.75), load_after=(4.0, 1.0, 0.8), steal=0.125),
        perf.SourceOutcome(source="scale", what="1M nodes", error="not available: vesper.benchmarks.perf.scale (ImportError)"),
    ], quick=True)
    path = perf.write_report(report, tmp_path / "docs" / "performance.md")
    text = path.read_text()
    assert not (tmp_path / "docs" / "performance.md.tmp").exists()
    for expected in (
        "`vesper bench perf --quick`", report.machine.cpu_model, f"{report.machine.cores} cores", "load average before",
        "1.00 / 2.00 / 3.00", "1 of 2 goals met", "| ratio met | 0.93× | >= 0.85 | pass |",
        "| latency missed | 7.5 ms | p99 < 5 ms | **FAIL** |", "| reported only | 5.835e+04 bytes | - | reported |",
        "**What bounds it:**", "```\n   ncalls  tottime", "41.2 vs 44.3 steps/s", "`vesper bench perf --only throughput`",
        "not available: vesper.benchmarks.perf.scale", "**`--quick`**", "exits 0",
        # the load each figure was taken on, not only the command's
        "Load average (1 / 5 / 15 min) 0.25 / 0.50 / 0.75 as it started, 4.00 / 1.00 / 0.80 as it ended.",
        "CPU time taken by the host for other guests (steal, /proc/stat): 12.5%.",
    ):
        assert expected in text, expected
    console = Console(record=True, width=200)
    perf.print_table(report, console)
    printed = console.export_text()
    assert "FAIL" in printed and "1 of 2 goals met; missed: latency missed" in printed
    assert "source(s) gave no figures" in printed


def test_steal_is_its_share_of_the_cpu_time_between_two_readings() -> None:
    assert perf.steal_share((1_000, 10), (1_400, 60)) == 0.125
    assert perf.steal_share(None, (1_400, 60)) is None and perf.steal_share((1_000, 10), (1_000, 10)) is None
    now = perf.cpu_times()
    if now is not None:  # Linux: all CPU time since boot, and steal within it
        assert now[0] > 0 and 0 <= now[1] <= now[0]


def test_a_new_report_keeps_the_recorded_sections(tmp_path: Path) -> None:
    """The GPU check runs on another machine (make gpu-check) and the 10M-node scale run for
    hours; the command that regenerates the document carries their recorded sections over, word
    for word, after its own figures, and adds none where there is none."""
    path = tmp_path / "performance.md"
    gpu = f"{perf.GPU_BEGIN}\n## The GPU check\n\n| check | cpu | cuda |\n{perf.GPU_END}"
    scale = f"{perf.SCALE_10M_BEGIN}\n### scale sparse-10m\n\n| figure | W = 1 |\n{perf.SCALE_10M_END}"
    path.write_text(f"# Performance\n\nold figures\n\n{gpu}\n\nmore old figures\n\n{scale}\n")
    text = perf.write_report(_report([]), path).read_text()
    assert "old figures" not in text
    assert text.count(gpu) == 1 and text.count(scale) == 1
    assert text.index("## Summary") < text.index(scale) < text.index(gpu)
    again = perf.write_report(_report([]), path).read_text()
    assert again.count(gpu) == 1 and again.count(scale) == 1  # again: still once each
    bare = perf.write_report(_report([]), tmp_path / "new.md").read_text()
    assert perf.GPU_BEGIN not in bare and perf.SCALE_10M_BEGIN not in bare


def _fake_module(monkeypatch: pytest.MonkeyPatch, **functions: object) -> str:
    module = types.ModuleType("vesper_fake_perf")
    for name, function in functions.items():
        setattr(module, name, function)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__name__


def test_a_missing_or_failing_source_is_reported_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    def good(quick: bool = False, workdir: Path | None = None) -> list[PerfFigure]:
        seen.update(quick=quick, workdir=workdir)
        return _figures()[:1]

    def broken(quick: bool = False) -> list[PerfFigure]:
        raise ZeroDivisionError("no steps were timed")

    def sampler(dataset_path: Path, repeats: int = 5, peer_env: Path | None = None) -> list[PerfFigure]:
        seen.update(dataset_path=dataset_path, repeats=repeats, peer_env=peer_env)
        return []

    name = _fake_module(monkeypatch, good=good, broken=broken, sampler_figures=sampler)
    context = perf.RunContext(quick=True, workdir=tmp_path, tolokers=tmp_path / "tolokers.npz")
    ok = perf.run_source(perf.Source("throughput", name, "good", "good"), context)
    assert ok.error == "" and [f.name for f in ok.figures] == ["ratio met"]
    assert seen == {"quick": True, "workdir": tmp_path / "throughput"}
    failed = perf.run_source(perf.Source("wire", name, "broken", "broken"), context)
    assert failed.figures == [] and failed.error.startswith("failed: ZeroDivisionError: no steps were timed")
    missing = perf.run_source(perf.Source("scale", "vesper_no_such_module", "scale_figures", "scale"), context)
    assert missing.error.startswith("not available: vesper_no_such_module.scale_figures (ModuleNotFoundError")
    no_data = perf.run_source(perf.Source("sampler", name, "sampler_figures", "sampler"), context)
    assert no_data.error.startswith("not measured: Tolokers not found at")
    (tmp_path / "tolokers.npz").write_bytes(b"")
    assert perf.run_source(perf.Source("sampler", name, "sampler_figures", "sampler"), context).error == ""
    assert seen["dataset_path"] == tmp_path / "tolokers.npz" and seen["repeats"] == 1 and seen["peer_env"] is None
    assert ok.load_before is not None and ok.load_after is not None  # every source's own load
    peered = context.model_copy(update={"peer_env": tmp_path / "peer"})
    assert perf.run_source(perf.Source("sampler", name, "sampler_figures", "sampler"), peered).error == ""
    assert seen["peer_env"] == tmp_path / "peer"  # --peer-env reaches the sampler figure


def test_the_command_writes_the_report_and_exits_0_with_a_missed_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vesper.coordinator.cli import app

    name = _fake_module(monkeypatch, figures=lambda quick=False: _figures())
    monkeypatch.setattr(perf, "SOURCES", (perf.Source("throughput", name, "figures", "fake"),))
    out = tmp_path / "performance.md"
    result = CliRunner().invoke(
        app, ["bench", "perf", "--quick", "--only", "throughput", "--out", str(out), "--workdir", str(tmp_path / "work")]
    )
    assert result.exit_code == 0, result.output
    assert "**FAIL**" in out.read_text() and "latency missed" in out.read_text()
    result = CliRunner().invoke(app, ["bench", "perf", "--only", "nonsense", "--out", str(out)])
    assert result.exit_code != 0 and "unknown source(s) nonsense" in result.output
    result = CliRunner().invoke(app, ["bench", "perf", "--peer-env", str(tmp_path / "nowhere"), "--out", str(out)])
    assert result.exit_code != 0 and "make bench-peer" in result.output


# -- 3. the measurement helpers ---------------------------------------------------------------
def test_percentile_and_steady_rate() -> None:
    values = [random.Random(3).random() for _ in range(101)]
    for q in (0, 50, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert steady_rate([1.0, 2.0, 2.5, 3.0, 3.5], 1) == (4 / 2.5, 4)
    with pytest.raises(ValueError, match="warm-up"):
        steady_rate([1.0, 2.0], 2)


def test_each_repeat_is_compared_with_the_one_process_run_made_beside_it() -> None:
    from vesper.benchmarks.perf.throughput import Rate, repeat_ratios

    two = [Rate(40.0, 3), Rate(30.0, 3), Rate(45.0, 3)]
    one = [Rate(50.0, 3), Rate(40.0, 3), Rate(50.0, 3)]
    text = repeat_ratios(two, one)
    assert "0.800, 0.750, 0.900; from 0.750 to 0.900." in text
    assert repeat_ratios(two[:1], one[:1]) == ""  # one repeat: its ratio is the figure itself
    with pytest.raises(ValueError):
        repeat_ratios(two, one[:2])


def test_bfloat16_halves_the_tensor_bytes_of_a_step() -> None:
    sizes = bytes_per_step("cora")
    (wire32, tensor32), (wire16, tensor16) = sizes["float32"], sizes["bfloat16"]
    assert tensor16 / tensor32 == 0.5
    assert 0.5 < wire16 / wire32 < 0.51  # node ids and framing do not shrink
    assert tensor32 == pytest.approx(2 * 4 * 64 * 1354 / 6)  # release + gradient, mean over the epoch
    assert framed(0) == 5 + 9 and framed(16_384) == 16_389 + 2 * 9


def test_the_seed_noise_verdict() -> None:
    same, difference, _, p_value = within_seed_noise([0.72, 0.74, 0.73], [0.725, 0.735, 0.73])
    assert same and abs(difference) < 1e-9 + 0.001 and p_value > 0.5
    moved, difference, spread, p_value = within_seed_noise([0.72, 0.721, 0.722], [0.70, 0.701, 0.702])
    assert not moved and difference == pytest.approx(-0.02) and spread < 0.002 and p_value < 0.05


def test_the_one_process_loop_trains_and_charges_each_step(tmp_path: Path, one_thread: None) -> None:
    options = ThroughputOptions(epochs=2, warmup_steps=2, repeats=1)
    from vesper.common.dataset_files import resolve_dataset

    rate = one_process_rate(options, resolve_dataset("cora"), tmp_path, charged=True)
    assert rate.steps_per_second > 0 and rate.timed_steps == 2 * 6 - 2
    assert set(rate.phases) == {"release", "charge", "label party", "update"}
    assert all(len(v) == rate.timed_steps for v in rate.phases.values())
    ledgers = list(tmp_path.glob("ledger-*.sqlite"))
    store = LedgerStore(ledgers[0])
    try:
        assert len(store.charges("one-process")) == 12
    finally:
        store.close()


def test_in_process_charges_are_timed_and_profiled(tmp_path: Path) -> None:
    charges, commits, profile = charges_in_process(tmp_path, 20)
    assert len(charges) == 20 and len(commits) == 20 and min(charges) > 0
    assert "ncalls" in profile and "charge" in profile
    assert len(paced_commits(tmp_path / "paced", 3, 0.001)) == 3
    # timed charges start after the warm-up: the first of each pass of 6 is counted
    counted, free = counted_split([float(i) for i in range(12)], 1)
    assert counted == [float(i) for i in range(12) if (WARMUP + i) % 6 == 0] and len(counted) + len(free) == 12
    assert counted_split([1.0, 2.0], None) == ([1.0, 2.0], [])


@pytest.mark.slow
def test_charges_over_grpc_alternate_with_health_checks(tmp_path: Path) -> None:
    """The transport's floor in the accountant figure: as many no-work round trips as charges;
    and the paced figure's floor, round trips alone with idle time between them."""
    from vesper.benchmarks.perf.accountant_latency import over_grpc, paced_pings

    pings: list[float] = []
    charges = over_grpc(tmp_path / "service", 20, pings=pings)
    assert len(charges) == len(pings) == 20
    assert all(0 < seconds < 30 for seconds in charges + pings)
    paced = paced_pings(tmp_path / "paced", 5, 0.01)
    assert len(paced) == 5 and all(0 < seconds < 30 for seconds in paced)


def test_the_throughput_bound_names_each_difference_and_the_transport_floor() -> None:
    from vesper.benchmarks.perf.throughput import Measurements, Rate, overhead_lines, phase_table

    def rate(**ms: float) -> Rate:
        return Rate(30.0, 3, {name: [value / 1000] * 3 for name, value in ms.items()})

    two = rate(release=10, charge=0.1, encode=0.2, journal=0.7, send=0.2, prefetch=2, wait=3, update=7, other=0.1)
    one = rate(release=11, charge=1.0, **{"label party": 2.0}, update=5)
    measurements = Measurements([two], [two], [one], [one], 0.001, [0.001, 0.002, 0.003], [(50.0, 40.0), (50.0, 45.0)])
    text = overhead_lines(measurements)
    assert "runs at 0.85x its rate alone (steps/s 50.0 → 40.0, 50.0 → 45.0)" in text
    assert "Two-party step 23.30 ms against 19.00 ms" in text
    assert "19.00 ms in the service against 16.00 ms" in text  # release + prefetch + update
    assert "3.00 ms against B's math 2.00 ms" in text
    assert "1.30 ms (charge receipt" in text and "p50 2.00 ms" in text
    assert "| **step** | **23.30** |" in phase_table(measurements)


def test_the_scale_options_reach_the_scale_source_and_bad_ones_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vesper.coordinator.cli import app

    seen: dict[str, object] = {}

    def scale(workdir: Path, profiles: tuple[str, ...] | None = None, workers: tuple[int, ...] | None = None) -> list:
        seen.update(profiles=profiles, workers=workers)
        return []

    name = _fake_module(monkeypatch, scale_figures=scale)
    context = perf.RunContext(workdir=tmp_path, tolokers=tmp_path / "t.npz")
    assert perf.run_source(perf.Source("scale", name, "scale_figures", "scale"), context).error == ""
    assert seen == {"profiles": None, "workers": None}  # the source's defaults
    chosen = context.model_copy(update={"scale_profiles": ["sparse-10m"], "scale_workers": [1, 2]})
    assert perf.run_source(perf.Source("scale", name, "scale_figures", "scale"), chosen).error == ""
    assert seen == {"profiles": ("sparse-10m",), "workers": (1, 2)}
    out = tmp_path / "performance.md"
    result = CliRunner().invoke(app, ["bench", "perf", "--only", "scale", "--scale-profile", "huge", "--out", str(out)])
    assert result.exit_code != 0 and "unknown scale profile(s) huge" in result.output and "sparse-10m" in result.output
    result = CliRunner().invoke(app, ["bench", "perf", "--only", "scale", "--scale-workers", "0", "--out", str(out)])
    assert result.exit_code != 0 and "at least 1" in result.output
    assert not out.exists()  # refused before anything ran


def test_the_layer_profile_counts_per_step_and_names_both_layers() -> None:
    """``python -m vesper.benchmarks.perf.layer_profile``: on the CPU no kernel is launched; the
    summary line of each model comes first, then the profiler's table."""
    from vesper.benchmarks.perf.layer_profile import layer_profile
    from vesper.common.dataset_files import resolve_dataset

    text = layer_profile(resolve_dataset("cora"), "cpu", 2)
    summaries = [line for line in text.splitlines() if line.startswith("== ")]
    assert [s.split(" on ")[0] for s in summaries] == ["== pmp-gcn", "== sparse GCN"]
    assert all("per step 0 kernel launches" in s and "device 0.000 ms" in s for s in summaries)
    assert "aten::" in text  # the operators, by self time
