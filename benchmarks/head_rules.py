"""The head B keeps, under two rules, on the same runs (docs/utility.md, section 7).

B keeps the edge-free head unless another leads it on validation by more than one SE of the
paired difference (party_b.head_choice); before that rule it kept the head with the best
validation metric. Each run of a degradation grid records every head's validation and test
metric (its summary's ``head_metrics``), so both rules can be read off the same runs:

    kept     the head B kept (the run's test metric, as in the degradation table)
    maximum  argmax_h M_val(h), ties to the first of HEADS (the earlier rule)
    edge-free  the edge-free head: the MLP baseline trained beside the extractor

Per extractor, graph and ε: each rule's mean test metric, Welch's one-sided p that the MLP's
mean is above it (as ``vesper bench degradation``), and in how many runs the rules differ.

    python -m vesper.benchmarks.head_rules --out bench/degradation [--extractor gap ...]
                                           [--notable-only] [--update docs/utility.md]

reads OUT/results.csv and the runs' summaries under OUT (``party_a/runs/<id>/summary.json``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.degradation import BASELINE, MIN_SEEDS, completed_runs
from vesper.benchmarks.extractor_table import TableRow, read_rows
from vesper.benchmarks.findings import SIGNIFICANCE, welch_one_sided
from vesper.party_b.decoders import HEADS  # the order ties go by

RULES = ("kept", "maximum", "edge-free")
BEGIN, END = "<!-- head-rules:begin (python -m vesper.benchmarks.head_rules) -->", "<!-- head-rules:end -->"


class HeadRuleCell(BaseModel):
    """One extractor at one ε on one graph: each rule's test metrics over its runs, and the MLP's."""

    dataset: str
    extractor: str
    epsilon: float
    tests: dict[str, list[float]]  # by rule (RULES)
    baseline: list[float]
    differ: int  # runs where the kept head is not the maximum's

    def p_below(self, rule: str) -> float | None:
        values = self.tests[rule]
        if len(values) < MIN_SEEDS or len(self.baseline) < MIN_SEEDS:
            return None
        return welch_one_sided(self.baseline, values).p


def maximum_head(head_metrics: dict[str, float]) -> str:
    """The earlier rule: the best validation metric, a tie to the first of HEADS."""
    return max(HEADS, key=lambda head: (head_metrics[f"val@{head}"], -HEADS.index(head)))


def summaries(out: Path) -> dict[str, dict[str, float]]:
    """Each run's head metrics ("<split>@<head>" → value) by run id, from its summary under ``out``."""
    found: dict[str, dict[str, float]] = {}
    for path in out.rglob("party_a/runs/*/summary.json"):
        metrics = json.loads(path.read_text()).get("head_metrics") or {}
        if metrics:
            found[path.parent.name] = {key: float(m["value"]) for key, m in metrics.items()}
    return found


def cells(
    rows: Sequence[TableRow], heads: dict[str, dict[str, float]], extractors: Sequence[str] | None = None,
) -> list[HeadRuleCell]:
    """A cell for every (graph, extractor, ε) whose runs all have their head metrics."""
    keys = dict.fromkeys(
        (r.dataset, r.extractor, r.epsilon_budget) for r in rows
        if r.extractor != BASELINE and (extractors is None or r.extractor in extractors)
    )
    found = []
    for dataset, extractor, epsilon in keys:
        runs = completed_runs(rows, dataset, extractor, epsilon)
        if not runs or any(r.run_id not in heads for r in runs):
            continue
        tests: dict[str, list[float]] = {rule: [] for rule in RULES}
        differ = 0
        for run in runs:
            metrics = heads[run.run_id]
            tests["kept"].append(float(run.test))  # type: ignore[arg-type]
            maximum = maximum_head(metrics)
            tests["maximum"].append(metrics[f"test@{maximum}"])
            tests["edge-free"].append(metrics["test@edge-free"])
            differ += run.head != maximum
        baseline = [float(r.test) for r in completed_runs(rows, dataset, BASELINE, None)]  # type: ignore[arg-type]
        found.append(HeadRuleCell(
            dataset=dataset, extractor=extractor, epsilon=epsilon, tests=tests, baseline=baseline, differ=differ,
        ))
    return found


def _text(cell: HeadRuleCell, rule: str) -> str:
    mean = statistics.fmean(cell.tests[rule])
    p = cell.p_below(rule)
    if p is None:
        return f"{mean:.3f}"
    return f"{mean:.3f} (p = {p:.2g}){' **below**' if p < SIGNIFICANCE else ''}"


def notable(cell: HeadRuleCell) -> bool:
    """A cell where the rules kept different heads in some run, or one of them is below the MLP."""
    return cell.differ > 0 or any((cell.p_below(rule) or 1.0) < SIGNIFICANCE for rule in RULES)


def markdown(found: Sequence[HeadRuleCell], command: str, notable_only: bool = False) -> str:
    shown = [cell for cell in found if notable(cell)] if notable_only else list(found)
    which = (f"The {len(shown)} cells of {len(found)} where the rules differ in some run or one is below the MLP. "
             if notable_only else "")
    lines = [
        BEGIN, "", f"Generated by `{command}`. {which}Mean test metric over a cell's runs under each rule (p: Welch's "
        "one-sided test that the MLP's mean is above it; **below**: p < 0.05); *differ*: runs where the two rules "
        "keep different heads.", "",
        "| extractor | graph | ε | runs | MLP | B's rule (kept) | best by validation | edge-free head | differ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in sorted(shown, key=lambda c: (c.extractor, c.dataset, c.epsilon)):
        epsilon = "∞" if cell.epsilon == float("inf") else f"{cell.epsilon:g}"
        lines.append(
            f"| {cell.extractor} | {cell.dataset} | {epsilon} | {len(cell.tests['kept'])} | "
            f"{statistics.fmean(cell.baseline):.3f} | {_text(cell, 'kept')} | {_text(cell, 'maximum')} | "
            f"{_text(cell, 'edge-free')} | {cell.differ} |"
        )
    below = {rule: sum(1 for c in found if (c.p_below(rule) or 1.0) < SIGNIFICANCE) for rule in RULES}
    gain = {rule: statistics.fmean(statistics.fmean(c.tests[rule]) - statistics.fmean(c.baseline) for c in found)
            for rule in RULES} if found else dict.fromkeys(RULES, 0.0)
    lines += [
        "", f"{len(found)} cells, {sum(c.differ for c in found)} of {sum(len(c.tests['kept']) for c in found)} runs "
        "differ. Cells below the MLP: " + ", ".join(f"{rule} {below[rule]}" for rule in RULES)
        + ". Mean over cells of the gain over the MLP: " + ", ".join(f"{rule} {gain[rule]:+.4f}" for rule in RULES)
        + ".", "", END,
    ]
    return "\n".join(lines)


def main(
    out: Path = typer.Option(Path("bench/degradation"), "--out", help="A degradation bench's folder (results.csv, runs)."),
    extractor: Optional[list[str]] = typer.Option(None, "--extractor", help="Only these extractors (repeat)."),
    notable_only: bool = typer.Option(
        False, "--notable-only", help="List only cells where the rules differ or one is below the MLP (the totals count all).",
    ),
    update: Optional[Path] = typer.Option(None, "--update", help=f"Also replace the {BEGIN} … {END} section of this file."),
) -> None:
    """Compare B's head rule with the best-by-validation rule on the same runs."""
    console = Console()
    rows = read_rows(out / "results.csv")
    if not rows:
        raise typer.BadParameter(f"no runs in {out / 'results.csv'}: run vesper bench degradation --out {out} first", param_hint="--out")
    found = cells(rows, summaries(out), extractor)
    command = "python -m vesper.benchmarks.head_rules --out " + str(out) + "".join(f" --extractor {e}" for e in extractor or [])
    command += " --notable-only" if notable_only else ""
    text = markdown(found, command, notable_only)
    if update is not None:
        from vesper.benchmarks.doc_sections import DocSectionError, replace_section

        try:
            update.write_text(replace_section(update.read_text(), text, BEGIN, END))
        except DocSectionError as exc:
            raise typer.BadParameter(str(exc), param_hint="--update") from None
    console.print(text, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    typer.run(main)
