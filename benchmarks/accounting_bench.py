"""Time and peak memory of calibrating long runs, per accountant: a command, not a test.

    python -m vesper.benchmarks.accounting_bench --steps 1000 --steps 10000
    vesper bench accounting --steps 1000 --steps 10000

Each row calibrates the noise multiplier z of one run to one target ε at δ = 1e-6
with :func:`vesper.common.privacy.accounting.calibrate` (or, for the ``bound6`` rows,
:func:`vesper.common.privacy.hidden_batch_reproduction.calibrate_bound6`), from a cold cache.

Scenarios (shared/design/privacy.md, "Why it matters": 150,000 training nodes, batch
256, D = 10, L = 1):

* ``hidden-batch``: T × PoissonSampled(γ, Gaussian(z)), γ = theorem21_gamma(150000, 256,
  10, 1) ≈ 0.00341 (the amplification of [VESPER, Thm. 2.1], valid only if B cannot see batches).
* ``visible-batch``: T × PoissonSampled(0.1, Gaussian(z)): a per-step Poisson subsample
  of edges at rate 0.1 drawn by A and hidden from B.

Memory: by default every row runs in a fresh Python subprocess, which reports
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (the peak resident set size, numpy's and
dp-accounting's C allocations included) once after its imports and once after the
calibration: ``peak_rss_mb`` is the second, ``rss_growth_mb`` the difference, i.e. how
far the calibration pushed the peak above the imported libraries. In-process rows
(``isolate=False``, for tests) report the same two numbers for the current process,
whose earlier peak can hide a smaller one: they are marked ``in-process``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Literal

import dp_accounting as dpa
from pydantic import BaseModel

from vesper.common.privacy.accounting import EpsilonResult, calibrate, clear_cache
from vesper.common.privacy.hidden_batch_reproduction import calibrate_bound6, theorem21_gamma

DELTA = 1e-6
TARGETS: tuple[float, ...] = (1.0, 4.0, 8.0)
HIDDEN_BATCH_GAMMA = theorem21_gamma(150_000, 256, 10, 1)
VISIBLE_EDGE_RATE = 0.1
SCENARIOS: dict[str, float] = {"hidden-batch": HIDDEN_BATCH_GAMMA, "visible-batch": VISIBLE_EDGE_RATE}
Requested = Literal["pld", "rdp", "bound6"]


class BenchmarkRow(BaseModel):
    scenario: str
    sampling_probability: float
    steps: int
    target_epsilon: float
    accountant_requested: str
    accountant_used: str
    detail: str
    noise_multiplier: float
    epsilon: float
    seconds: float
    peak_rss_mb: float
    rss_growth_mb: float
    measured_in: Literal["subprocess", "in-process"]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def _detail(result: EpsilonResult) -> str:
    if result.discretization is not None:
        return f"interval {result.discretization:g}"
    if result.order is not None:
        return f"order {result.order:g}"
    return ""


def measure(
    scenario: str, steps: int, target: float, accountant: Requested, *, measured_in: str = "in-process"
) -> BenchmarkRow:
    """Calibrate one run in this process, from a cold cache, and time it."""
    q = SCENARIOS[scenario]
    clear_cache()
    before = _rss_mb()
    start = time.perf_counter()
    if accountant == "bound6":
        z, epsilon, order = calibrate_bound6(target, q, steps, DELTA)
        used, detail = "bound6", f"order {order}"
    else:
        z, result = calibrate(
            lambda z: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps),
            target, DELTA, accountant=accountant,
        )
        epsilon, used, detail = result.epsilon, result.accountant, _detail(result)
    seconds = time.perf_counter() - start
    peak = _rss_mb()
    return BenchmarkRow(
        scenario=scenario, sampling_probability=q, steps=steps, target_epsilon=target,
        accountant_requested=accountant, accountant_used=used, detail=detail, noise_multiplier=z,
        epsilon=epsilon, seconds=seconds, peak_rss_mb=peak, rss_growth_mb=peak - before,
        measured_in=measured_in,  # type: ignore[arg-type]
    )


def _child() -> None:
    """Entry point of a row's subprocess: a JSON spec on stdin, a JSON row on stdout."""
    spec = json.loads(sys.stdin.read())
    row = measure(spec["scenario"], spec["steps"], spec["target"], spec["accountant"], measured_in="subprocess")
    print(row.model_dump_json())


def _measure_isolated(scenario: str, steps: int, target: float, accountant: Requested) -> BenchmarkRow:
    spec = json.dumps({"scenario": scenario, "steps": steps, "target": target, "accountant": accountant})
    done = subprocess.run(
        [sys.executable, "-c", "from vesper.benchmarks.accounting_bench import _child; _child()"],
        input=spec, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark row {spec} failed:\n{done.stderr}")
    return BenchmarkRow.model_validate_json(done.stdout.strip().splitlines()[-1])


def run(
    steps: Iterable[int] = (1000, 10000),
    accountants: Iterable[Requested] = ("pld", "rdp"),
    targets: Iterable[float] = TARGETS,
    *,
    scenarios: Iterable[str] = ("hidden-batch", "visible-batch"),
    bound6: bool = True,
    isolate: bool = True,
) -> list[BenchmarkRow]:
    """One row per scenario × steps × accountant × target, plus [VESPER, bound (6)] for hidden-batch."""
    one = _measure_isolated if isolate else measure
    plan: list[tuple[str, int, float, Requested]] = []
    for scenario in scenarios:
        for n in steps:
            requested: list[Requested] = list(accountants)
            if bound6 and scenario == "hidden-batch":
                requested.append("bound6")
            plan += [(scenario, n, target, accountant) for accountant in requested for target in targets]
    return [one(*row) for row in plan]


def render(rows: Sequence[BenchmarkRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"calibrating z for a target ε at δ = {DELTA:g} (cold cache, {_where(rows)})")
    for column in ("scenario", "q", "steps", "target ε", "asked", "used", "detail", "z", "ε", "s", "peak MB", "+MB"):
        table.add_column(column, justify="left" if column in ("scenario", "asked", "used", "detail") else "right")
    for r in rows:
        table.add_row(
            r.scenario, f"{r.sampling_probability:.5g}", str(r.steps), f"{r.target_epsilon:g}",
            r.accountant_requested, r.accountant_used, r.detail, f"{r.noise_multiplier:.4f}",
            f"{r.epsilon:.4f}", f"{r.seconds:.2f}", f"{r.peak_rss_mb:.0f}", f"{r.rss_growth_mb:.0f}",
        )
    Console(width=160).print(table)


def _where(rows: Sequence[BenchmarkRow]) -> str:
    kinds = {r.measured_in for r in rows}
    return "one subprocess per row" if kinds == {"subprocess"} else "in this process"


def main(
    steps: Sequence[int] | None = None,
    accountants: Sequence[Requested] | None = None,
    targets: Sequence[float] | None = None,
    *,
    argv: Sequence[str] | None = None,
    isolate: bool = True,
    show: bool = True,
) -> list[BenchmarkRow]:
    """Run the benchmark, print its table and return the rows.

    Called with ``steps`` (the CLI's ``vesper bench accounting``), or with ``argv`` as
    ``python -m vesper.benchmarks.accounting_bench [--steps N]... [--accountant A]... [--target E]... [--in-process]``.
    """
    if steps is None:
        parser = argparse.ArgumentParser(prog="python -m vesper.benchmarks.accounting_bench", description=__doc__.split("\n")[0])
        parser.add_argument("--steps", type=int, action="append", help="run length (repeat); default 1000 and 10000")
        parser.add_argument("--accountant", choices=("pld", "rdp"), action="append", help="default: both")
        parser.add_argument("--target", type=float, action="append", help=f"target ε (repeat); default {TARGETS}")
        parser.add_argument("--in-process", action="store_true", help="no subprocess per row (memory less exact)")
        args = parser.parse_args(list(argv) if argv is not None else [])
        steps = args.steps or [1000, 10000]
        accountants = accountants or args.accountant
        targets = targets or args.target
        isolate = isolate and not args.in_process
    rows = run(steps, accountants or ("pld", "rdp"), targets or TARGETS, isolate=isolate)
    if show:
        render(rows)
    return rows


if __name__ == "__main__":
    main(argv=sys.argv[1:])
