"""``vesper bench audit``: the attacks of ``vesper audit`` across budgets, extractors and
accounting modes (docs/audit.md).

A cell is (dataset, extractor, accounting, ε, seed). Each cell trains

* an **audit run** on A's full graph with ``audit.canaries`` planted and
  ``audit.record_releases``: edge inference and the one-run canary audit read it;
* a **membership run** (TFTS, ``audit.membership``) where the extractor can be trained on
  a subgraph and evaluated on the full graph (cost model ``per-step`` or ``none``): the
  membership attack reads it. Separate runs, because TFTS hides every edge outside the
  training subgraph from training, which would weaken the canary and edge attacks.

Rows go to ``results.csv`` as each cell ends (a killed sweep resumes). ε = ∞ releases
without noise and charges nothing, so it runs once (under visible-batch) and stands for
both modes.
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.harness import newest_only, parse_epsilons, run_cells
from vesper.common.config import RunConfig, RunSummary
from vesper.common.dotted_settings import set_dotted
from vesper.coordinator.public_facts import with_published_edge_bound

if TYPE_CHECKING:
    from vesper.auditor.run_audit import AuditReport

DEFAULT_EXTRACTORS = ("pmp-gcn", "gap")
DEFAULT_EPSILONS = (1.0, 4.0, 16.0, math.inf)
MODES = ("hidden-batch", "visible-batch")
# m: canary pairs use 2m distinct training nodes of low degree; the draw takes as many as fit
DEFAULT_CANARIES = 500
TFTS_COST_MODELS = ("per-step", "none")


@dataclass(frozen=True)
class AuditedRun:
    """What a driver returns: the run's summary and where each party kept its files."""

    summary: RunSummary
    party_a_workdir: Path
    party_b_workdir: Path


Driver = Callable[[RunConfig], AuditedRun]


class AuditRow(BaseModel):
    dataset: str
    extractor: str
    accounting: str
    epsilon_budget: float
    seed: int
    status: str
    message: str = ""
    metric: str = ""
    test: float | None = None
    epsilon_spent: float = 0.0
    delta: float = 0.0
    run_id: str = ""
    edge_auc: float | None = None
    canaries: int = 0
    canary_guesses: int = 0
    canary_correct: int = 0
    canary_bound: float | None = None  # B's similarity guesses
    mechanism_guesses: int = 0
    mechanism_correct: int = 0
    mechanism_bound: float | None = None  # white box: A's noisy aggregates, every release
    release_bound: float | None = None  # white box: B's sums of the releases
    replay_bound: float | None = None  # white box: the evaluation release replayed (TFTS runs only)
    confidence: float = 0.95
    membership_run_id: str = ""
    membership_attack: str = ""
    membership_auc: float | None = None
    membership_entropy_auc: float | None = None
    membership_epsilon_spent: float | None = None
    seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str, str, float, int]:
        return (self.dataset, self.extractor, self.accounting, self.epsilon_budget, self.seed)

    @property
    def best_bound(self) -> float | None:
        """The pre-registered primary bound (coordinator.audit.AuditReport.primary_canary_audit):
        the white box where the extractor has one, else B's similarity."""
        return self.mechanism_bound if self.mechanism_bound is not None else self.canary_bound

    @property
    def bound_exceeds_accountant(self) -> bool:
        """Any scorer's bound above the accountant's ε: a bug to investigate."""
        bounds = (self.canary_bound, self.mechanism_bound, self.release_bound, self.replay_bound)
        return any(b is not None and b > self.epsilon_spent for b in bounds)


def dataset_label(dataset: str) -> str:
    return Path(dataset).stem if dataset.endswith(".npz") else dataset


def planned_cells(
    datasets: Sequence[str], extractors: Sequence[str], modes: Sequence[str], epsilons: Sequence[float], seeds: int,
) -> list[tuple[str, str, str, float, int]]:
    """Every (dataset, extractor, accounting, ε, seed) to run; ε = ∞ once, under visible-batch."""
    cells = []
    for dataset in datasets:
        for extractor in extractors:
            for epsilon in epsilons:
                for mode in (("visible-batch",) if math.isinf(epsilon) else modes):
                    cells += [(dataset, extractor, mode, epsilon, seed) for seed in range(seeds)]
    return cells


def cell_config(
    base: RunConfig, dataset: str, extractor: str, accounting: str, epsilon: float, seed: int, *,
    canaries: int = 0, membership: bool = False,
) -> RunConfig:
    from vesper.benchmarks.extractor_table import recipe_settings

    data = base.model_dump(mode="json")
    data.update({"dataset": dataset, "seed": seed})
    data["extractor"].update({"name": extractor, "params": {}})
    for dotted, value in recipe_settings(base, extractor).items():
        set_dotted(data, dotted, value)
    data["privacy"].update({"epsilon": epsilon, "accounting": accounting})
    data["audit"] = {"canaries": canaries, "canary_seed": seed, "membership": membership, "record_releases": True}
    return with_published_edge_bound(RunConfig.model_validate(data))


def supports_tfts(extractor: str) -> bool:
    from vesper.party_a.extractors.registry import lookup

    return lookup(extractor).spec.cost_model in TFTS_COST_MODELS


def audit_cell(
    drive: Driver, base: RunConfig, cell: tuple[str, str, str, float, int], canaries: int, confidence: float,
    membership: bool = True,
) -> AuditRow:
    """Both runs of one cell, each audited as soon as it ends."""
    from vesper.auditor.run_audit import audit_run

    dataset, extractor, accounting, epsilon, seed = cell
    started = time.monotonic()
    row = AuditRow(
        dataset=dataset_label(dataset), extractor=extractor, accounting=accounting, epsilon_budget=epsilon,
        seed=seed, status="failed", confidence=confidence,
    )
    run = drive(cell_config(base, dataset, extractor, accounting, epsilon, seed, canaries=canaries))
    summary = run.summary
    row = row.model_copy(update={
        "status": summary.status, "message": summary.message if summary.status != "completed" else "",
        "run_id": summary.run_id, "epsilon_spent": summary.epsilon_spent, "delta": summary.delta,
        "metric": summary.test_metric.name if summary.test_metric else "",
        "test": summary.test_metric.value if summary.test_metric else None,
    })
    if summary.status != "completed":
        return row.model_copy(update={"seconds": round(time.monotonic() - started, 1)})
    update = canary_columns(audit_run(summary.run_id, run.party_a_workdir, run.party_b_workdir, confidence=confidence, seed=seed))
    if membership and supports_tfts(extractor):
        tfts = drive(cell_config(base, dataset, extractor, accounting, epsilon, seed, membership=True))
        update.update({"membership_run_id": tfts.summary.run_id, "membership_epsilon_spent": tfts.summary.epsilon_spent})
        if tfts.summary.status == "completed":
            update.update(membership_columns(
                audit_run(tfts.summary.run_id, tfts.party_a_workdir, tfts.party_b_workdir, confidence=confidence, seed=seed)
            ))
        else:
            update["message"] = f"membership run {tfts.summary.status}: {tfts.summary.message}"
    update["seconds"] = round(time.monotonic() - started, 1)
    return row.model_copy(update=update)


def canary_columns(report: AuditReport) -> dict[str, object]:
    """A row's edge-inference and canary columns, from the audit of the cell's canary run."""
    update: dict[str, object] = {"edge_auc": report.edge_inference.auc if report.edge_inference else None}
    if report.canaries is not None:
        update.update({
            "canaries": report.canaries.m, "canary_guesses": report.canaries.guesses,
            "canary_correct": report.canaries.correct, "canary_bound": report.canaries.epsilon_lower_bound,
        })
    if report.canaries_mechanism is not None:
        update.update({
            "mechanism_guesses": report.canaries_mechanism.guesses,
            "mechanism_correct": report.canaries_mechanism.correct,
            "mechanism_bound": report.canaries_mechanism.epsilon_lower_bound,
        })
    if report.canaries_release is not None:
        update["release_bound"] = report.canaries_release.epsilon_lower_bound
    if report.canaries_replay is not None:
        update["replay_bound"] = report.canaries_replay.epsilon_lower_bound
    return update


def membership_columns(report: AuditReport) -> dict[str, object]:
    """A row's membership columns, from the audit of the cell's TFTS run."""
    if report.membership is None:
        return {}
    return {
        "membership_attack": report.membership.attack, "membership_auc": report.membership.auc,
        "membership_entropy_auc": report.membership.entropy_auc,
    }


def _workdirs(out_dir: Path, run_id: str) -> tuple[Path, Path]:
    """Party A's and B's workdirs of the cluster that ran ``run_id`` under OUT."""
    for cluster in sorted(out_dir.glob("*-*/")):
        if (cluster / "party_a" / "runs" / run_id).is_dir():
            return cluster / "party_a", cluster / "party_b"
    raise FileNotFoundError(f"run {run_id} is in no cluster under {out_dir}: it cannot be re-scored")


def rescore(rows: Sequence[AuditRow], out_dir: Path, confidence: float, console: Console) -> list[AuditRow]:
    """The attacks again on the runs the rows name, without training anything: for when an
    attack or the confidence changed. The runs' files must still be under OUT."""
    from vesper.auditor.run_audit import audit_run

    rescored = []
    for row in rows:
        if row.status != "completed":
            rescored.append(row)
            continue
        console.print(f"re-scoring {row.dataset} · {row.extractor} · {row.accounting} · ε={_eps(row.epsilon_budget)}", highlight=False)
        a_dir, b_dir = _workdirs(out_dir, row.run_id)
        update = canary_columns(audit_run(row.run_id, a_dir, b_dir, confidence=confidence, seed=row.seed))
        if row.membership_run_id:
            a_dir, b_dir = _workdirs(out_dir, row.membership_run_id)
            update.update(membership_columns(audit_run(row.membership_run_id, a_dir, b_dir, confidence=confidence, seed=row.seed)))
        rescored.append(row.model_copy(update={**update, "confidence": confidence}))
    return rescored


def read_rows(path: Path) -> list[AuditRow]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [
            AuditRow.model_validate({k: (None if v == "" and AuditRow.model_fields[k].default is None else v) for k, v in row.items()})
            for row in csv.DictReader(handle)
        ]


def write_rows(path: Path, rows: Sequence[AuditRow]) -> None:
    """Rewrite OUT/results.csv with ``rows`` (after re-scoring), through a temporary file."""
    partial = path.with_suffix(".csv.partial")
    partial.unlink(missing_ok=True)
    for row in rows:
        append_row(partial, row)
    partial.replace(path)


def append_row(path: Path, row: AuditRow) -> None:
    fresh = not path.exists()
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(AuditRow.model_fields))
        if fresh:
            writer.writeheader()
        writer.writerow({k: ("" if v is None else v) for k, v in row.model_dump().items()})


def run_audit_bench(
    base: RunConfig, datasets: Sequence[str], extractors: Sequence[str], modes: Sequence[str],
    epsilons: Sequence[float], seeds: int, out_dir: Path, drivers: Callable[[ExitStack], Sequence[Driver]],
    console: Console, *, canaries: int = DEFAULT_CANARIES, confidence: float = 0.95, membership: bool = True,
) -> list[AuditRow]:
    """Run every cell not yet in OUT/results.csv; return the rows of this grid. ``drivers``
    opens one driver per job on the stack, and is called only if a cell is missing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    done = {row.key: row for row in read_rows(csv_path) if row.status == "completed"}
    planned = planned_cells(datasets, extractors, modes, epsilons, seeds)
    rows = [done[k] for c in planned if (k := (dataset_label(c[0]), *c[1:])) in done]
    missing = [c for c in planned if (dataset_label(c[0]), *c[1:]) not in done]
    console.print(f"audit: {len(planned)} cells, {len(planned) - len(missing)} already done", highlight=False)
    if not missing:
        return rows
    with ExitStack() as stack:
        ran = run_cells(
            missing, drivers(stack), lambda drive, cell: audit_cell(drive, base, cell, canaries, confidence, membership),
            lambda row: append_row(csv_path, row),
            lambda c: f"audit · {dataset_label(c[0])} · {c[1]} · {c[2]} · ε={_eps(c[3])} · seed {c[4]}", console,
        )
    # a cell run again after a failure keeps only its newest row
    write_rows(csv_path, newest_only(read_rows(csv_path), (row.key for row in ran)))
    return rows + ran


# -- the report ------------------------------------------------------------------------------
def _eps(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:g}"


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def _cell_rows(rows: Sequence[AuditRow], dataset: str, extractor: str, mode: str, epsilon: float) -> list[AuditRow]:
    wanted = "visible-batch" if math.isinf(epsilon) else mode
    return [
        r for r in rows
        if r.status == "completed" and r.dataset == dataset and r.extractor == extractor
        and r.accounting == wanted and r.epsilon_budget == epsilon
    ]


def _membership_text(members: Sequence[AuditRow]) -> str:
    scored = [r for r in members if r.membership_auc is not None]
    if not scored:
        return "—"
    attack = scored[0].membership_attack
    text = f"{attack} {_mean_std([r.membership_auc for r in scored])}"
    entropy = [r.membership_entropy_auc for r in scored if r.membership_entropy_auc is not None]
    if attack != "entropy" and entropy:
        text += f" (entropy {_mean_std(entropy)})"
    return text


def _bound_text(members: Sequence[AuditRow]) -> str:
    """B's bound and the white-box replay's, of the seed whose better bound is largest."""
    bounded = [r for r in members if r.best_bound is not None]
    if not bounded:
        return "—"
    worst = max(bounded, key=lambda r: r.best_bound or 0.0)
    flag = " **ABOVE the accountant's ε: investigate**" if worst.bound_exceeds_accountant else ""
    parts = []
    if worst.mechanism_bound is not None:
        parts.append(f"**{worst.mechanism_bound:.2f}** white box ({worst.mechanism_correct}/{worst.mechanism_guesses} right)")
    if worst.release_bound is not None:
        parts.append(f"{worst.release_bound:.2f} B's sums")
    if worst.canary_bound is not None:
        similarity = f"{worst.canary_bound:.2f} B's similarity ({worst.canary_correct}/{worst.canary_guesses} right)"
        parts.append(f"**{similarity}**" if worst.mechanism_bound is None else similarity)
    if worst.replay_bound is not None:
        parts.append(f"{worst.replay_bound:.2f} replay")
    return f"{'; '.join(parts)}; m = {worst.canaries}; ε spent {worst.epsilon_spent:.3g}{flag}"


def markdown(
    rows: Sequence[AuditRow], extractors: Sequence[str], modes: Sequence[str], epsilons: Sequence[float],
    seeds: int, command: str, plots: Sequence[str] = (),
) -> str:
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    confidence = rows[0].confidence if rows else 0.95
    lines = [
        "## Empirical privacy audit",
        "",
        f"Generated by `{command}`: {seeds} seed(s) per cell, every run through the services, attacks from "
        f"party B's position on what B received (docs/audit.md). Edge AUC: true edges against as many non-edges, "
        "scored by the similarity of their releases. Membership AUC: TFTS runs (train on the subgraph of B's "
        "training nodes, evaluate on the full graph), entropy attack for two classes and the shadow-model attack "
        "otherwise (with the entropy score beside it: from B's position the shadow decoder cannot re-learn A's "
        "encoder, docs/audit-attacks.md); — where the extractor cannot be trained on a subgraph without a second one-shot release "
        f"(GAP). Canary bound: the one-run lower bound on ε (Steinke, Nasr and Jagielski 2023) at confidence "
        f"{confidence:g}, in bold the pre-registered primary scorer (docs/audit-canaries.md): the white box (A's "
        "noisy aggregates at every release of a canary endpoint, the events the accountant composes) where the "
        "extractor has one, else B's similarity of releases; the other scorers beside it, each a valid bound on "
        "its own, any of them above the accountant's ε flagged. The largest over seeds is shown, beside the ε "
        "the accountant charged that run. Canaries join B's training nodes of lowest degree. ε = ∞ runs once, "
        "without noise, and stands for both modes.",
        "",
    ]
    for dataset in datasets:
        lines += [f"### {dataset}", "", "| extractor | accounting | ε | edge AUC | membership AUC | canary ε lower bound |",
                  "|---|---|---|---|---|---|"]
        for extractor in extractors:
            for mode in modes:
                for epsilon in epsilons:
                    if math.isinf(epsilon) and mode != modes[-1]:
                        continue
                    members = _cell_rows(rows, dataset, extractor, mode, epsilon)
                    if not members:
                        continue
                    shown_mode = "either (no noise)" if math.isinf(epsilon) else mode
                    edge = _mean_std([r.edge_auc for r in members if r.edge_auc is not None])
                    mia = _membership_text(members)
                    lines.append(f"| {extractor} | {shown_mode} | {_eps(epsilon)} | {edge} | {mia} | {_bound_text(members)} |")
        lines.append("")
    lines += ["### Does the hidden-batch accounting survive the audit?", "", *_survival(rows), ""]
    failed = [r for r in rows if r.status != "completed"]
    if failed:
        lines += ["### Runs that did not complete", ""]
        lines += [f"- {r.dataset} · {r.extractor} · {r.accounting} · ε={_eps(r.epsilon_budget)} · seed {r.seed}: "
                  f"{r.status}: {r.message}" for r in failed]
        lines.append("")
    lines += [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _survival(rows: Sequence[AuditRow]) -> list[str]:
    hidden = [r for r in rows if r.status == "completed" and r.accounting == "hidden-batch" and r.best_bound is not None]
    above = [r for r in rows if r.status == "completed" and r.bound_exceeds_accountant]
    lines = []
    broken = [r for r in hidden if r.bound_exceeds_accountant]
    if not hidden:
        lines.append("- No hidden-batch run with canaries completed: not measured.")
    elif broken:
        lines.append(
            f"- **No.** {len(broken)} of {len(hidden)} hidden-batch runs have an empirical lower bound above the ε "
            "hidden-batch accounting reported: "
            + "; ".join(f"{r.dataset} {r.extractor} ε={_eps(r.epsilon_budget)}: {r.best_bound:.2f} > {r.epsilon_spent:.3g}" for r in broken)
            + ". B sees every batch's node ids, so the amplification hidden-batch assumes is not there."
        )
    else:
        tightest = max(hidden, key=lambda r: (r.best_bound or 0.0) / max(r.epsilon_spent, 1e-12))
        lines.append(
            f"- **Not contradicted.** In all {len(hidden)} hidden-batch runs the canary lower bound stays below the "
            f"hidden-batch ε (closest: {tightest.dataset} {tightest.extractor} ε={_eps(tightest.epsilon_budget)}, "
            f"bound {tightest.best_bound:.2f} vs {tightest.epsilon_spent:.3g}). A one-run audit can only refute an "
            "accountant, never confirm it: this does not make hidden-batch a guarantee against B, who sees batch ids "
            "(docs/privacy.md)."
        )
    visible_above = [r for r in above if r.accounting == "visible-batch"]
    if visible_above:
        lines.append(
            "- **Visible-batch bound exceeded — a bug to investigate:** "
            + "; ".join(f"{r.dataset} {r.extractor} ε={_eps(r.epsilon_budget)}" for r in visible_above)
        )
    else:
        lines.append("- Under visible-batch no empirical bound exceeds the accountant's ε.")
    return lines


# -- the command -----------------------------------------------------------------------------
def audited_drivers(stack, out: Path, jobs: int, in_process: bool, console: Console) -> list[Driver]:
    """One driver per job, each with its own services (or in-process cluster), entered on ``stack``."""
    from vesper.coordinator.processes import LocalCluster
    from vesper.coordinator.run_client import drive_run

    drivers: list[Driver] = []
    for index in range(jobs):
        workdir = (out / f"cluster-{index}").resolve()
        if in_process:
            from vesper.coordinator.in_process import InProcessCluster

            cluster = stack.enter_context(InProcessCluster(workdir))

            def drive(config: RunConfig, cluster=cluster, workdir=workdir) -> AuditedRun:
                return AuditedRun(cluster.drive(config), workdir / "party_a", workdir / "party_b")
        else:
            cluster = stack.enter_context(LocalCluster(workdir))

            def drive(config: RunConfig, cluster=cluster, workdir=workdir) -> AuditedRun:
                return AuditedRun(drive_run(cluster.party_a_address, config, console), workdir / "party_a", workdir / "party_b")
        drivers.append(drive)
    return drivers


def plot_rows(rows: Sequence[AuditRow], out_dir: Path) -> list[Path]:
    """[VESPER, Fig. 4]-style plots of each attack's AUC against ε (benchmarks/attack_plots.py)."""
    from vesper.benchmarks.attack_plots import AttackRow, plot_attack_auc

    attack_rows = []
    for r in rows:
        if r.status != "completed":
            continue
        attacks = [("edge inference", r.edge_auc), (f"membership ({r.membership_attack})", r.membership_auc)]
        if r.membership_attack != "entropy":
            attacks.append(("membership (entropy)", r.membership_entropy_auc))
        for attack, auc in attacks:
            if auc is not None:
                attack_rows.append(AttackRow(
                    dataset=r.dataset, extractor=r.extractor, accounting=r.accounting, epsilon=r.epsilon_budget,
                    seed=r.seed, attack=attack, auc=auc, epsilon_spent=r.epsilon_spent, run_id=r.run_id,
                ))
    path = out_dir / "attack-auc.png"
    if attack_rows:
        plot_attack_auc(attack_rows, path)
        return [path]
    return []


def _rescore_grid(
    out: Path, datasets: Sequence[str], extractors: Sequence[str], modes: Sequence[str], epsilons: Sequence[float],
    seeds: int, confidence: float, console: Console,
) -> list[AuditRow]:
    """Re-score every row of OUT/results.csv, rewrite it, and return the rows of this grid."""
    csv_path = out / "results.csv"
    every = rescore(read_rows(csv_path), out, confidence, console)
    write_rows(csv_path, every)
    wanted = {(dataset_label(c[0]), *c[1:]) for c in planned_cells(datasets, extractors, modes, epsilons, seeds)}
    return [r for r in every if r.key in wanted]


def audit_bench_command(
    dataset: list[str] = typer.Option(["cora"], "--dataset", help="A bundled name or an .npz path (repeat the flag)."),
    extractor: list[str] = typer.Option(list(DEFAULT_EXTRACTORS), "--extractor", help="Extractors to audit (repeat)."),
    epsilon: list[str] = typer.Option(["1", "4", "16", "inf"], "--epsilon", help="Budgets (repeat; 'inf' = no noise)."),
    accounting: list[str] = typer.Option(list(MODES), "--accounting", help="Accounting modes (repeat)."),
    seeds: int = typer.Option(1, "--seeds", help="Seeds per cell.", min=1),
    epochs: int = typer.Option(20, "--epochs", help="Training epochs of every run.", min=1),
    canaries: int = typer.Option(DEFAULT_CANARIES, "--canaries", help="m, canary pairs asked per run (A plants as many as its low-degree training nodes allow).", min=1),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the canary bound.", min=0.5, max=0.9999),
    membership: bool = typer.Option(True, "--membership/--no-membership", help="Also train a TFTS run per cell for the membership attack."),
    rescore: bool = typer.Option(
        False, "--rescore", help="Train nothing: run the attacks again on the runs OUT/results.csv names (their files are under OUT).",
    ),
    jobs: int = typer.Option(1, "--jobs", help="Runs at a time, each with its own services.", min=1),
    in_process: bool = typer.Option(False, "--in-process", help="The same code in one process instead of the services."),
    out: Path = typer.Option(Path("bench/audit"), "--out", help="Directory for results.csv, results.md and the plots."),
) -> None:
    """The attacks of `vesper audit` over extractors, budgets and accounting modes.

    Per cell an audited run with canaries (edge inference, the one-run ε lower bound) and,
    where the extractor allows it, a TFTS run (membership inference). Resumable: cells in
    OUT/results.csv are not run again. Writes OUT/results.md and OUT/attack-auc.png.
    """
    from vesper.coordinator.processes import ServiceStartError
    from vesper.coordinator.run_client import RunClientError

    console = Console()
    budgets = parse_epsilons(epsilon)
    unknown = [m for m in accounting if m not in MODES]
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: expected hidden-batch or visible-batch", param_hint="--accounting")
    base = RunConfig(epochs=epochs)
    command = " ".join([
        "vesper bench audit", *(f"--dataset {d}" for d in dataset), *(f"--extractor {e}" for e in extractor),
        *(f"--epsilon {e}" for e in epsilon), *(f"--accounting {a}" for a in accounting), f"--seeds {seeds}",
        f"--epochs {epochs}", f"--canaries {canaries}", f"--confidence {confidence:g}",
        *([] if membership else ["--no-membership"]),
    ])
    try:
        if rescore:
            rows = _rescore_grid(out, dataset, extractor, accounting, budgets, seeds, confidence, console)
        else:
            rows = run_audit_bench(
                base, dataset, extractor, accounting, budgets, seeds, out,
                lambda stack: audited_drivers(stack, out, jobs, in_process, console), console,
                canaries=canaries, confidence=confidence, membership=membership,
            )
    except FileNotFoundError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    except (ServiceStartError, RunClientError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    plots = [p.name for p in plot_rows(rows, out)]
    (out / "results.md").write_text(markdown(rows, extractor, accounting, budgets, seeds, command, plots))
    console.print((out / "results.md").read_text(), highlight=False)
    if any(r.bound_exceeds_accountant for r in rows if r.accounting == "visible-batch"):
        console.print("[bold red]an empirical bound exceeds the accountant's ε under visible-batch: investigate[/]")
        raise typer.Exit(5)
