"""How much noise each accounting mode puts on a PMP run, and where hidden-batch's budget goes.

For a dataset file and a run configuration, the noise multiplier z of each mode is the one the
accountant calibrates for the run's real plan (the extractor's charge plan over B's split,
:func:`signal_to_noise.noise_multiplier`), so θ = z · S is what the run adds. Under
``hidden-batch`` the run is charged the larger of two numbers ([VESPER, Thm. 2.1] with γ as
dp-accounting's sampling probability, and [VESPER, bound (6)] with [VESPER, Lemma 2]), and the
evaluation sweep, which samples nothing, is charged as one unsampled Gaussian
(docs/privacy.md 5.2). This module separates the parts: the z each number alone needs, the z
both need when only training is charged (the paper accounts "the entire training period" and
says nothing of its test-time release, [VESPER, App. C.4]), and bound (6)'s floor (the smallest
ε any noise reaches, docs/utility.md "Bound (6) has a floor"). Nothing is run or charged.

    python -m vesper.benchmarks.hidden_batch_noise FILE.npz [FILE.npz ...] [--epochs N] [--epsilon E]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Optional

import torch
import typer
from pydantic import BaseModel

from vesper.benchmarks.extractor_sweep import with_budget
from vesper.benchmarks.extractor_table import run_config
from vesper.benchmarks.signal_to_noise import noise_multiplier, roots_of
from vesper.common.config import RunConfig
from vesper.common.privacy.accounting.calibration import calibrate
from vesper.common.privacy.hidden_batch_reproduction import calibrate_bound6, hidden_batch_bound6_epsilon
from vesper.common.privacy.ledger import PlanRule, composed_event, counted_per_kind
from vesper.party_a.extractors.base import ChargePlan, ExtractorSetup, RootPlan
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.run import GraphData

# z at which bound (6) is read as its limit z → ∞ (docs/utility.md uses the same)
FLOOR_Z = 1e5


class ModeNoise(BaseModel):
    accounting: str
    noise_multiplier: float | None  # z, as the accountant calibrates it; None: no z reaches the budget
    sensitivity: float  # S that θ = z · S refers to
    noise_std: float | None  # θ, the per-coordinate std the run adds


class HiddenBatchParts(BaseModel):
    """Hidden-batch's z taken apart: which number binds, and what charging the evaluation costs."""

    gamma: float  # [VESPER, Thm. 2.1]
    steps: int  # training steps, every one counted
    eval_precision: float  # Σ n_i / s_i² of the evaluation sweep's unsampled Gaussians
    floor: float  # bound (6) at z = FLOOR_Z: no noise brings ε below it
    # each None where no z reaches the budget (below bound (6)'s floor)
    z_events: float | None  # dp-accounting's ε of the events alone reaches the budget
    z_bound6: float | None  # bound (6) with Lemma 2 alone reaches it
    z_train_only: float | None  # both, the evaluation sweep not charged (the paper's accounting)
    bound6_train_share: float | None  # at the run's z: bound (6)'s ε of the training steps alone


class NoiseReport(BaseModel):
    dataset: str
    extractor: str
    train_nodes: int
    epochs: int
    batch_size: int
    epsilon: float
    delta: float
    modes: list[ModeNoise]
    hidden: HiddenBatchParts | None  # None when the extractor has no hidden-batch accounting


def _plan(dataset: Path, data: GraphData, config: RunConfig) -> tuple[ChargePlan, RootPlan]:
    cls = lookup(config.extractor.name)
    setup = ExtractorSetup(
        config=config, params=validated_params(cls.spec, config), graph=data.graph, features=data.features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2), delta=config.privacy.delta,
    )
    roots = roots_of(config, dataset)
    return cls(setup).charge_plan(roots), roots


def _events_z(rules: list[PlanRule], counted: dict[str, int], epsilon: float, config: RunConfig) -> float:
    privacy = config.privacy
    z, _ = calibrate(
        lambda z: composed_event({r.kind: r.event(z) for r in rules}, counted), epsilon, privacy.delta,
        accountant=privacy.accountant,
    )
    return z


def _or_none(solve: Callable[[], float]) -> float | None:
    """A calibration's z, or None where no noise reaches the budget."""
    try:
        return solve()
    except ValueError:
        return None


def hidden_parts(plan: ChargePlan, roots: RootPlan, config: RunConfig, z: float | None) -> HiddenBatchParts:
    """The parts of a hidden-batch plan (a sampled ``train`` rule, an unsampled ``eval`` rule)."""
    privacy = config.privacy
    passes = plan.passes(config.epochs, roots)
    counted = counted_per_kind(passes, {r.kind: r.participation_bound for r in plan.rules})
    train = next(r for r in plan.rules if r.kind == "train")
    if train.sampling_probability >= 1.0:
        raise ValueError(f"{config.extractor.name}'s hidden-batch plan samples no training step: nothing to take apart")
    gamma, steps = train.sampling_probability, counted["train"]
    precision = sum(counted[r.kind] / r.noise_scale**2 for r in plan.rules if r.kind != "train")
    eps, delta = privacy.epsilon, privacy.delta
    train_events = _or_none(lambda: _events_z([train], {"train": steps}, eps, config))
    train_bound6 = _or_none(lambda: calibrate_bound6(eps, gamma, steps, delta)[0])
    return HiddenBatchParts(
        gamma=gamma, steps=steps, eval_precision=precision,
        floor=hidden_batch_bound6_epsilon(FLOOR_Z, gamma, steps, delta)[0],
        z_events=_or_none(lambda: _events_z(plan.rules, counted, eps, config)),
        z_bound6=_or_none(lambda: calibrate_bound6(eps, gamma, steps, delta, unsampled_releases=precision)[0]),
        z_train_only=None if train_events is None or train_bound6 is None else max(train_events, train_bound6),
        bound6_train_share=None if z is None else hidden_batch_bound6_epsilon(z, gamma, steps, delta)[0],
    )


def noise_report(dataset: Path, base: RunConfig, extractor: str = "pmp-gcn") -> NoiseReport:
    """z, S and θ under each mode for ``dataset``'s split, and hidden-batch's parts."""
    data = GraphData.load(dataset, torch.device("cpu"))
    modes, hidden, roots, config = [], None, None, base
    for accounting in ("visible-batch", "hidden-batch"):
        config = run_config(with_budget(base, base.privacy.epsilon, accounting), str(dataset), extractor, 0)
        if accounting not in lookup(extractor).spec.accountings:
            continue
        plan, roots = _plan(dataset, data, config)
        z = _or_none(partial(noise_multiplier, plan, roots, config, config.privacy.delta))
        modes.append(ModeNoise(
            accounting=accounting, noise_multiplier=z, sensitivity=plan.sensitivity,
            noise_std=None if z is None else z * plan.sensitivity,
        ))
        if accounting == "hidden-batch":
            hidden = hidden_parts(plan, roots, config, z)
    assert roots is not None
    return NoiseReport(
        dataset=dataset.stem, extractor=extractor, train_nodes=roots.train_ids.numel(), epochs=config.epochs,
        batch_size=config.batch_size, epsilon=config.privacy.epsilon, delta=config.privacy.delta, modes=modes,
        hidden=hidden,
    )


def _z(value: float | None, digits: int = 3) -> str:
    return "none" if value is None else f"{value:.{digits}f}"


def markdown(reports: list[NoiseReport]) -> str:
    """One row per dataset: z and θ per mode, hidden-batch's parts."""
    lines = [
        "| dataset | N_T | epochs | T (steps) | γ | bound (6) floor | z visible (θ) | z hidden (θ) | "
        "z events / bound (6) | bound (6) ε of training at z hidden | z hidden, training only |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        by_mode = {m.accounting: m for m in r.modes}
        vis, hid, h = by_mode.get("visible-batch"), by_mode.get("hidden-batch"), r.hidden

        def cell(m: ModeNoise | None) -> str:
            if m is None or m.noise_multiplier is None or m.noise_std is None:
                return "none reaches ε"
            return f"{m.noise_multiplier:.3f} ({m.noise_std:.3f})"

        parts = (
            ["—"] * 6 if h is None else [
                str(h.steps), f"{h.gamma:.4f}", f"{h.floor:.2f}", cell(vis), cell(hid),
                f"{_z(h.z_events)} / {_z(h.z_bound6)}",
            ]
        )
        tail = "— | —" if h is None else f"{_z(h.bound6_train_share, 2)} | {_z(h.z_train_only)}"
        lines.append(f"| {r.dataset} | {r.train_nodes:,} | {r.epochs} | " + " | ".join(parts) + f" | {tail} |")
    return "\n".join(lines)


def main(
    datasets: list[Path] = typer.Argument(..., help=".npz files (vesper data synth, or the bench's OUT/data/)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs (default: RunConfig's, 50)."),
    epsilon: float = typer.Option(4.0, "--epsilon", help="The run's budget."),
    extractor: str = typer.Option("pmp-gcn", "--extractor"),
) -> None:
    """Print, per dataset, z and θ under each mode and hidden-batch's parts (markdown)."""
    missing = [str(d) for d in datasets if not d.is_file()]
    if missing:
        raise typer.BadParameter(f"no such file: {', '.join(missing)}", param_hint="DATASETS")
    base = with_budget(RunConfig() if epochs is None else RunConfig(epochs=epochs), epsilon)
    reports = [noise_report(d.resolve(), base, extractor) for d in datasets]
    typer.echo(f"{extractor}, ε = {epsilon:g}, δ = {base.privacy.delta:g}, batch {base.batch_size}, "
               f"fanout {base.extractor.fanout}, L = {base.extractor.layers}")
    typer.echo(markdown(reports))


if __name__ == "__main__":
    typer.run(main)
