"""VESPER's qualitative findings, decided from the rows of ``vesper bench utility``.

The paper (``shared/seeds/vesper.txt``, [VESPER, §3] and [VESPER, App. C.6]) states four findings.
Each is decided here separately under each accounting mode and decoder, per dataset, from
the completed runs only, with one statistic for all four (docs/utility.md):

**X beats Y** when Welch's one-sided t-test over seeds gives p < 0.05 for
mean(X) − mean(Y) + m > 0, where m is a margin (0 except in (d)):

    (W1)  t = (x̄ − ȳ + m) / √(s_x²/n_x + s_y²/n_y)
    (W2)  ν = (s_x²/n_x + s_y²/n_y)² / ((s_x²/n_x)²/(n_x − 1) + (s_y²/n_y)²/(n_y − 1)), Welch–Satterthwaite
    (W3)  p = P(T_ν > t)

with x̄, s_x, n_x the mean, sample standard deviation and number of seeds of X. It needs at
least two seeds on each side (otherwise the comparison is *not measured*); when both
samples have zero spread, p is 0 if x̄ − ȳ + m > 0 and 1 otherwise.

* **(a)** PMP-GCN with truncated message passing (``pmp-gcn`` at its ``D_min``) beats the
  MLP at ε = 4, on every dataset.
* **(b)** GIN aggregation wins on dense graphs, truncated GCN on sparse ones: on a dense
  dataset ``pmp-gin`` beats ``pmp-gcn``, on a sparse one ``pmp-gcn`` beats ``pmp-gin``, at
  every ε of the grid in {4, 8} (the paper's "moderate privacy", where it states both).
  Dense means the mean degree 2|E|/N of A's simple undirected graph exceeds ln N
  ([VESPER, App. C.1]: dense ≫ log N, sparse ≪ log N).
* **(c)** VESPER beats GAP, which beats VFGNN: at every ε of the grid in {4, 8, 16}, the
  better of ``pmp-gin``/``pmp-gcn`` by mean at that ε beats ``gap``, and ``gap`` beats ``vfgnn``.
* **(d)** At ε = 16–32 GIN on dense graphs comes within a few points of the non-private
  model: on every dense dataset, at every ε of the grid in {16, 32}, ``pmp-gin`` at ε beats
  ``pmp-gin`` at ε = ∞ with margin m = 0.03 (a non-inferiority test of "at most 0.03 below").

A dataset's outcome: *does not hold* if any of its measured comparisons fails; else *not
measured* if a comparison it needs has a missing cell (or fewer than two seeds); else
*holds*. A finding's outcome over datasets follows the same rule. "Does not hold" means
the runs do not show it at p < 0.05, which includes "not significantly".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, computed_field

from vesper.benchmarks.extractor_sweep import HIDDEN, VISIBLE, Traits, registry_traits, served_cell
from vesper.benchmarks.extractor_table import Cell, TableRow

Outcome = Literal["holds", "does not hold", "not measured"]
FindingKey = Literal["a", "b", "c", "d"]

SIGNIFICANCE = 0.05
MIN_SEEDS = 2
NEAR_MARGIN = 0.03  # (d): "within a few points" of the non-private model
EPSILON_A = (4.0,)
EPSILONS_B = (4.0, 8.0)
EPSILONS_C = (4.0, 8.0, 16.0)
EPSILONS_D = (16.0, 32.0)

CLAIMS: dict[str, str] = {
    "a": "PMP-GCN with truncated message passing beats the MLP at ε = 4 on every dataset",
    "b": "GIN aggregation wins on dense graphs, truncated GCN on sparse ones (ε ∈ {4, 8})",
    "c": "VESPER (the better of PMP-GIN and PMP-GCN) beats GAP, which beats VFGNN (ε ∈ {4, 8, 16})",
    "d": f"at ε ∈ {{16, 32}} PMP-GIN on dense graphs is within {NEAR_MARGIN:g} of its non-private (ε = ∞) model",
}


# -- the data ---------------------------------------------------------------------------------
class GraphDensity(BaseModel):
    """A's graph as [VESPER, App. C.1] classifies it: dense iff 2|E|/N > ln N."""

    dataset: str
    nodes: int
    edges: int  # undirected, without self-loops or duplicates

    @computed_field
    @property
    def mean_degree(self) -> float:
        return 2 * self.edges / self.nodes

    @computed_field
    @property
    def log_nodes(self) -> float:
        return math.log(self.nodes)

    @computed_field
    @property
    def dense(self) -> bool:
        return self.mean_degree > self.log_nodes

    @property
    def kind(self) -> str:
        return "dense" if self.dense else "sparse"


def simple_edge_count(edges: np.ndarray) -> int:
    """|E| of the simple undirected graph: symmetrised, self-loops and duplicates dropped."""
    low, high = np.minimum(edges[:, 0], edges[:, 1]), np.maximum(edges[:, 0], edges[:, 1])
    keep = low != high
    return int(np.unique(np.stack([low[keep], high[keep]], axis=1), axis=0).shape[0])


def graph_density(label: str, path: Path) -> GraphDensity:
    """Read A's edges from ``path`` (either .npz layout) and classify the graph."""
    from vesper.common.dataset_files import load_graph_part

    part = load_graph_part(path)
    return GraphDensity(dataset=label, nodes=part.num_nodes, edges=simple_edge_count(part.edges))


# -- the statistic ----------------------------------------------------------------------------
class WelchTest(BaseModel):
    t: float | None
    df: float | None
    p: float


def welch_one_sided(x: Sequence[float], y: Sequence[float], margin: float = 0.0) -> WelchTest:
    """p of "mean(x) − mean(y) + margin > 0" by Welch's t-test (eqs. W1–W3 of the module docstring)."""
    from scipy.stats import t as student_t

    difference = statistics.fmean(x) - statistics.fmean(y) + margin
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    if vx + vy == 0:  # no spread on either side: the sign decides
        return WelchTest(t=None, df=None, p=0.0 if difference > 0 else 1.0)
    t = difference / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return WelchTest(t=t, df=df, p=float(student_t.sf(t, df)))


class Side(BaseModel):
    """One side of a comparison: an extractor at an ε, over seeds."""

    extractor: str
    epsilon: float
    mean: float | None = None
    std: float | None = None
    n: int = 0
    epsilon_spent: float | None = None

    @classmethod
    def of(cls, extractor: str, epsilon: float, cell: Cell | None) -> Side:
        if cell is None:
            return cls(extractor=extractor, epsilon=epsilon)
        return cls(extractor=extractor, epsilon=epsilon, mean=cell.mean, std=cell.std, n=len(cell.values),
                   epsilon_spent=cell.epsilon_spent)

    @property
    def text(self) -> str:
        eps = "∞" if math.isinf(self.epsilon) else f"{self.epsilon:g}"
        if self.mean is None:
            return f"{self.extractor} at ε = {eps}: no completed run"
        return f"{self.extractor} at ε = {eps}: {self.mean:.4f} ± {self.std:.4f} (n = {self.n})"


class Comparison(BaseModel):
    """"first beats second" (with ``margin``: "first > second − margin") on one dataset."""

    dataset: str
    first: Side
    second: Side
    margin: float = 0.0
    values_first: list[float] = []
    values_second: list[float] = []
    test: WelchTest | None = None
    outcome: Outcome
    reason: str = ""

    @property
    def difference(self) -> float | None:
        if self.first.mean is None or self.second.mean is None:
            return None
        return self.first.mean - self.second.mean

    @property
    def text(self) -> str:
        relation = "beats" if not self.margin else f"is within {self.margin:g} of (or above)"
        head = f"{self.first.text} {relation} {self.second.text}"
        if self.test is None:
            return f"{head}: not measured ({self.reason})"
        diff = f"difference {self.difference:+.4f}"
        stat = f"t = {self.test.t:.2f}, ν = {self.test.df:.1f}, " if self.test.t is not None else "no spread, "
        return f"{head}: {diff}, {stat}p = {self.test.p:.3g} → {self.outcome}"


def compare(dataset: str, first: Side, second: Side, x: Cell | None, y: Cell | None, margin: float = 0.0) -> Comparison:
    """Decide "first beats second" (or is within ``margin``) by :func:`welch_one_sided`."""
    base = {"dataset": dataset, "first": first, "second": second, "margin": margin}
    missing = [
        s.extractor + ("" if math.isinf(s.epsilon) else f" at ε = {s.epsilon:g}")
        for s, c in ((first, x), (second, y)) if c is None
    ]
    if missing:
        return Comparison(**base, outcome="not measured", reason="no completed run of " + " and ".join(missing))
    assert x is not None and y is not None
    few = [s.extractor for s, c in ((first, x), (second, y)) if len(c.values) < MIN_SEEDS]
    if few:
        return Comparison(
            **base, values_first=x.values, values_second=y.values, outcome="not measured",
            reason=f"fewer than {MIN_SEEDS} seeds of {' and '.join(few)}: no spread to test against",
        )
    test = welch_one_sided(x.values, y.values, margin)
    outcome: Outcome = "holds" if test.p < SIGNIFICANCE else "does not hold"
    return Comparison(**base, values_first=x.values, values_second=y.values, test=test, outcome=outcome)


# -- decisions ----------------------------------------------------------------------------------
class DatasetVerdict(BaseModel):
    dataset: str
    density: str
    outcome: Outcome
    comparisons: list[Comparison]
    note: str = ""


class Finding(BaseModel):
    key: FindingKey
    claim: str
    accounting: str
    decoder: str
    datasets: list[DatasetVerdict]
    note: str = ""

    @computed_field
    @property
    def outcome(self) -> Outcome:
        return combine([d.outcome for d in self.datasets])


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """Any failure → does not hold; else anything missing (or nothing at all) → not measured; else holds."""
    if "does not hold" in outcomes:
        return "does not hold"
    if not outcomes or "not measured" in outcomes:
        return "not measured"
    return "holds"


Lookup = Callable[[str, str, float], Cell | None]  # (dataset, extractor, ε) → its cell in this mode


def _verdict(dataset: str, density: GraphDensity, comparisons: list[Comparison], note: str = "") -> DatasetVerdict:
    return DatasetVerdict(
        dataset=dataset, density=density.kind, outcome=combine([c.outcome for c in comparisons]),
        comparisons=comparisons, note=note,
    )


def _pair(lookup: Lookup, dataset: str, a: str, eps_a: float, b: str, eps_b: float, margin: float = 0.0) -> Comparison:
    x, y = lookup(dataset, a, eps_a), lookup(dataset, b, eps_b)
    return compare(dataset, Side.of(a, eps_a, x), Side.of(b, eps_b, y), x, y, margin)


def _present(wanted: Iterable[float], grid: Sequence[float]) -> list[float]:
    return [e for e in wanted if e in grid]


def decide_a(lookup: Lookup, densities: Mapping[str, GraphDensity], grid: Sequence[float]) -> list[DatasetVerdict]:
    """(a): pmp-gcn at ε = 4 beats mlp, per dataset."""
    verdicts = []
    for dataset, density in densities.items():
        if 4.0 not in grid:
            verdicts.append(_verdict(dataset, density, [], "ε = 4 is not in the grid"))
            continue
        verdicts.append(_verdict(dataset, density, [_pair(lookup, dataset, "pmp-gcn", 4.0, "mlp", 4.0)]))
    return verdicts


def decide_b(lookup: Lookup, densities: Mapping[str, GraphDensity], grid: Sequence[float]) -> list[DatasetVerdict]:
    """(b): on a dense dataset pmp-gin beats pmp-gcn, on a sparse one the reverse, at every ε in {4, 8} ∩ grid."""
    verdicts = []
    for dataset, density in densities.items():
        winner, loser = ("pmp-gin", "pmp-gcn") if density.dense else ("pmp-gcn", "pmp-gin")
        comparisons = [_pair(lookup, dataset, winner, e, loser, e) for e in _present(EPSILONS_B, grid)]
        note = "" if comparisons else "no ε of {4, 8} in the grid"
        verdicts.append(_verdict(dataset, density, comparisons, note))
    return verdicts


def _vesper_at(lookup: Lookup, dataset: str, epsilon: float) -> tuple[str, str]:
    """(better, note): the VESPER extractor with the higher mean at ε, and which was chosen and why."""
    gin, gcn = lookup(dataset, "pmp-gin", epsilon), lookup(dataset, "pmp-gcn", epsilon)
    if gin is None and gcn is None:
        return "pmp-gcn", "neither pmp-gin nor pmp-gcn completed"
    if gin is None or (gcn is not None and gcn.mean >= gin.mean):
        return "pmp-gcn", "pmp-gcn" + ("" if gin is None else f" ({gcn.mean:.4f} ≥ pmp-gin {gin.mean:.4f})")
    return "pmp-gin", "pmp-gin" + ("" if gcn is None else f" ({gin.mean:.4f} > pmp-gcn {gcn.mean:.4f})")


def decide_c(lookup: Lookup, densities: Mapping[str, GraphDensity], grid: Sequence[float]) -> list[DatasetVerdict]:
    """(c): the better VESPER extractor beats gap and gap beats vfgnn, at every ε in {4, 8, 16} ∩ grid."""
    verdicts = []
    for dataset, density in densities.items():
        comparisons, chosen = [], []
        for epsilon in _present(EPSILONS_C, grid):
            vesper, why = _vesper_at(lookup, dataset, epsilon)
            chosen.append(f"ε = {epsilon:g}: {why}")
            comparisons.append(_pair(lookup, dataset, vesper, epsilon, "gap", epsilon))
            comparisons.append(_pair(lookup, dataset, "gap", epsilon, "vfgnn", epsilon))
        note = ("VESPER's extractor by mean: " + "; ".join(chosen)) if chosen else "no ε of {4, 8, 16} in the grid"
        verdicts.append(_verdict(dataset, density, comparisons, note))
    return verdicts


def decide_d(lookup: Lookup, densities: Mapping[str, GraphDensity], grid: Sequence[float]) -> list[DatasetVerdict]:
    """(d): on dense datasets pmp-gin at ε ∈ {16, 32} ∩ grid is within 0.03 of pmp-gin at ε = ∞."""
    verdicts = []
    for dataset, density in densities.items():
        if not density.dense:
            continue
        comparisons = [
            _pair(lookup, dataset, "pmp-gin", e, "pmp-gin", math.inf, NEAR_MARGIN) for e in _present(EPSILONS_D, grid)
        ]
        if comparisons and math.inf not in grid:
            comparisons = []
        note = "" if comparisons else "the grid needs ε = ∞ and an ε of {16, 32}"
        verdicts.append(_verdict(dataset, density, comparisons, note))
    return verdicts


DECIDERS = {"a": decide_a, "b": decide_b, "c": decide_c, "d": decide_d}


def _hidden_batch_note(key: str, traits: Traits) -> str:
    """What (c) under hidden-batch compares, given how GAP and VFGNN are accounted here."""
    if key != "c":
        return ""
    gap, vfgnn = traits("gap"), traits("vfgnn")
    parts = []
    if gap.cost_model == "one-shot":
        parts.append(
            "vesper's GAP releases its hops once over the whole graph, so hidden-batch credits it no "
            "amplification; the paper's GAP was a per-batch variant credited with Theorem 2.1's γ, so this "
            "comparison is harder on GAP than the paper's"
            + ("; its visible-batch runs stand in" if gap.accounting_free else "")
        )
    if HIDDEN not in vfgnn.accountings and not vfgnn.accounting_free:
        parts.append("VFGNN has no hidden-batch accounting: GAP against VFGNN cannot be measured under it")
    return "; ".join(parts)


def decide(
    rows: Sequence[TableRow], densities: Mapping[str, GraphDensity], *, traits: Traits = registry_traits,
    epsilons: Sequence[float] | None = None, accountings: Sequence[str] = (HIDDEN, VISIBLE),
    decoders: Sequence[str] | None = None,
) -> list[Finding]:
    """Every finding under every accounting mode and decoder, per dataset of ``densities``.

    ``epsilons`` is the grid's (default: every ε of the rows); a finding only looks at the ε
    of its claim that the grid has.
    """
    grid = sorted(set(epsilons if epsilons is not None else (r.epsilon_budget for r in rows)))
    decoders = list(decoders) if decoders is not None else list(dict.fromkeys(r.decoder for r in rows)) or ["concat"]
    findings = []
    for decoder in decoders:
        for accounting in accountings:
            def lookup(
                dataset: str, extractor: str, epsilon: float, _a: str = accounting, _d: str = decoder,
            ) -> Cell | None:
                return served_cell(rows, dataset, extractor, _d, _a, epsilon, traits)

            for key, decider in DECIDERS.items():
                findings.append(Finding(
                    key=key, claim=CLAIMS[key], accounting=accounting, decoder=decoder,
                    datasets=decider(lookup, densities, grid),
                    note=_hidden_batch_note(key, traits) if accounting == HIDDEN else "",
                ))
    return findings


# -- the report ---------------------------------------------------------------------------------
def _cell_text(verdict: DatasetVerdict | None) -> str:
    if verdict is None:
        return "not part of the claim (sparse)"
    return verdict.outcome


def markdown(findings: Sequence[Finding], densities: Mapping[str, GraphDensity]) -> str:
    """The findings section of docs/results.md: a summary table, then every number that decided it."""
    datasets = list(densities)
    decoders = list(dict.fromkeys(f.decoder for f in findings))
    lines = [
        "## VESPER's findings, reproduced",
        "",
        "Decided by `vesper.benchmarks.findings` from the completed runs (docs/utility.md): *X beats Y* = "
        f"Welch's one-sided t-test over seeds, p < {SIGNIFICANCE:g} (at least {MIN_SEEDS} seeds each); dense = "
        "mean degree 2|E|/N above ln N. `hidden-batch` is the paper's accounting (Theorem 2.1), which assumes B "
        "cannot tell which edges a step used; B can, so only `visible-batch` is a guarantee.",
        "",
        "Datasets: " + "; ".join(
            f"{d.dataset} {d.kind} (N = {d.nodes:,}, |E| = {d.edges:,}, mean degree {d.mean_degree:.1f} "
            f"{'>' if d.dense else '≤'} ln N = {d.log_nodes:.1f})" for d in densities.values()
        ) + ".",
        "",
    ]
    for decoder in decoders:
        ours = [f for f in findings if f.decoder == decoder]
        lines += [
            f"### Decoder {decoder}", "",
            "| finding | accounting | overall | " + " | ".join(datasets) + " |",
            "|---|---|---|" + "---|" * len(datasets),
        ]
        for finding in ours:
            by_dataset = {v.dataset: v for v in finding.datasets}
            lines.append(
                f"| ({finding.key}) {finding.claim} | {finding.accounting} | **{finding.outcome}** | "
                + " | ".join(_cell_text(by_dataset.get(d)) for d in datasets) + " |"
            )
        lines.append("")
        for finding in ours:
            lines.append(f"**({finding.key}) under {finding.accounting}, decoder {decoder}: {finding.outcome}.**"
                         + (f" {finding.note}." if finding.note else ""))
            lines.append("")
            if not finding.datasets:
                about = " (it is about dense graphs)" if finding.key == "d" else ""
                lines.append(f"- no dataset of the claim in the grid{about}")
            for verdict in finding.datasets:
                lines.append(f"- {verdict.dataset} ({verdict.density}): {verdict.outcome}"
                             + (f" — {verdict.note}" if verdict.note else ""))
                lines += [f"  - {c.text}" for c in verdict.comparisons]
            lines.append("")
    return "\n".join(lines)
