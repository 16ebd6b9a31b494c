"""The table of docs/pmp-at-scale.md (issue #21 item 4): PMP-GCN against the MLP on the 100,000-node
synthetic graphs, from the runs of ``vesper bench utility`` kept in one CSV.

Each setting is one ``vesper bench utility --out DIR`` (``as-charged``: the runs as vesper
charges them; an ablation: the same runs at a fixed noise multiplier, ``--config`` with
``[run.extractor] noise_multiplier``). ``--combine SETTING=DIR`` copies DIR/results.csv into the
kept CSV with a first column ``setting``; the table then gives, per dataset, setting, extractor
and mode, mean ± std (n) of the test metric, the noise multiplier, and Welch's one-sided p of
"above the MLP of the same dataset" (:func:`findings.welch_one_sided`, the statistic of
finding (a)).

    python -m vesper.benchmarks.pmp_at_scale docs/pmp-large-runs.csv [--combine SETTING=DIR ...]
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel

from vesper.benchmarks.findings import welch_one_sided

BASELINE = "mlp"


class Run(BaseModel):
    """One completed run of the kept CSV (the columns this table reads)."""

    setting: str
    dataset: str
    extractor: str
    accounting: str
    seed: int
    epsilon_budget: float
    test: float
    noise_multiplier: float | None = None
    epsilon_spent: float | None = None
    head: str = ""


class Group(BaseModel):
    setting: str
    dataset: str
    extractor: str
    accounting: str
    values: list[float]
    noise_multipliers: list[float]
    p_above_mlp: float | None  # None: the MLP or either side with fewer than two runs

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) > 1 else None


def combine(kept: Path, settings: dict[str, Path]) -> None:
    """Rewrite ``kept`` with every row of each setting's DIR/results.csv, ``setting`` first."""
    rows: list[dict[str, str]] = []
    fields: list[str] = ["setting"]
    for setting, out in settings.items():
        path = out / "results.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: run vesper bench utility --out {out} first")
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            fields += [f for f in reader.fieldnames or [] if f not in fields]
            rows += [{"setting": setting, **row} for row in reader]
    with kept.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def read_runs(kept: Path) -> list[Run]:
    """The completed rows of the kept CSV."""
    with kept.open(newline="") as handle:
        return [
            Run.model_validate({k: (None if v == "" and k in ("noise_multiplier", "epsilon_spent") else v)
                                for k, v in row.items()})
            for row in csv.DictReader(handle) if row["status"] == "completed"
        ]


def groups(runs: list[Run]) -> list[Group]:
    """One group per (setting, dataset, extractor, mode), each non-MLP one tested against its dataset's MLP
    (the MLP reads no edge: its runs serve every setting and mode of the dataset)."""
    cells: dict[tuple[str, str, str, str], list[Run]] = defaultdict(list)
    baseline: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        if run.extractor == BASELINE:
            baseline[run.dataset].append(run.test)
        cells[(run.setting, run.dataset, run.extractor, run.accounting)].append(run)
    found = []
    for (setting, dataset, extractor, accounting), members in cells.items():
        values = [r.test for r in members]
        mlp = baseline.get(dataset, [])
        testable = extractor != BASELINE and len(values) > 1 and len(mlp) > 1
        found.append(Group(
            setting=setting, dataset=dataset, extractor=extractor, accounting=accounting, values=values,
            noise_multipliers=[r.noise_multiplier for r in members if r.noise_multiplier is not None],
            p_above_mlp=welch_one_sided(values, mlp).p if testable else None,
        ))
    return sorted(found, key=lambda g: (g.dataset, g.extractor != BASELINE, g.setting, g.accounting))


def markdown(found: list[Group]) -> str:
    lines = [
        "| dataset | setting | extractor | mode | test ROC-AUC, mean ± std (n) | z | p (above the MLP) |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in found:
        spread = "" if g.std is None else f" ± {g.std:.4f}"
        z = f"{statistics.fmean(g.noise_multipliers):.3f}" if g.noise_multipliers else "—"
        p = "—" if g.p_above_mlp is None else f"{g.p_above_mlp:.3g}"
        mode = "any (reads no edge)" if g.extractor == BASELINE else g.accounting
        lines.append(
            f"| {g.dataset} | {g.setting} | {g.extractor} | {mode} | {g.mean:.4f}{spread} ({len(g.values)}) | {z} | {p} |"
        )
    return "\n".join(lines)


def main(
    kept: Path = typer.Argument(..., help="The kept CSV (docs/pmp-large-runs.csv)."),
    combine_: Optional[list[str]] = typer.Option(
        None, "--combine", help="SETTING=DIR: rewrite KEPT from these benchmarks' results.csv (repeat)."
    ),
) -> None:
    """Print the table of docs/pmp-at-scale.md from the kept runs."""
    if combine_:
        settings = {}
        for item in combine_:
            setting, sep, out = item.partition("=")
            if not sep or not setting or not out:
                raise typer.BadParameter(f"{item!r}: expected SETTING=DIR, e.g. as-charged=bench/pmp-large",
                                         param_hint="--combine")
            settings[setting] = Path(out)
        try:
            combine(kept, settings)
        except FileNotFoundError as exc:
            raise typer.BadParameter(str(exc), param_hint="--combine") from None
    if not kept.is_file():
        raise typer.BadParameter(f"{kept} does not exist: pass --combine SETTING=DIR to write it", param_hint="KEPT")
    typer.echo(markdown(groups(read_runs(kept))))


if __name__ == "__main__":
    typer.run(main)
