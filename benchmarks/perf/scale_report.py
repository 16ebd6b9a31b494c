"""The scale runs' figures (benchmarks/perf/scale.py): what :func:`figures_of` makes of one
:class:`~vesper.benchmarks.perf.scale.ScaleRun` (party A's peak against the goal on sparse-1m
with one process, each service's peak, each of A's workers' with W > 1, the epoch, the graph's
generation), and the exact command behind each figure."""

from __future__ import annotations

from vesper.benchmarks.perf.figures import PerfFigure
from vesper.benchmarks.perf.scale import (
    COMMAND,
    DEFAULT_PROFILES,
    GOAL_A_PEAK_MIB,
    GOAL_PROFILE,
    ScaleOptions,
    ScaleRun,
)


def _mib(value: float) -> str:
    return f"{value:,.0f} MiB"


def _split(run: ScaleRun, service: str) -> str:
    if service not in run.end_split_mib:
        return "no reading at the end"
    anon, file = run.end_split_mib[service]
    return f"at the end {_mib(anon)} heap (RssAnon) + {_mib(file)} file-backed (RssFile: mapped files, libraries)"


def _phases_text(run: ScaleRun) -> str:
    if not run.step_phases_ms:
        return "no step timings from A"
    phases = ", ".join(f"{name} {ms:.1f}" for name, ms in run.step_phases_ms.items() if name != "step" and ms >= 0.05)
    return f"A's median step {run.step_phases_ms.get('step', 0.0):.1f} ms ({phases})"


def command_of(run: ScaleRun) -> str:
    """The command that makes ``run``'s figures: the default one, with the options that chose a
    profile outside the default pair or more than one of A's workers."""
    extra = "" if run.graph.profile.name in DEFAULT_PROFILES else f" --scale-profile {run.graph.profile.name}"
    if run.options.workers > 1:
        extra += f" --scale-workers {run.options.workers}"
    return COMMAND + extra


def run_name(profile: str, options: ScaleOptions) -> str:
    """A run's name in its figures: the profile's, with ``W=2`` beside it for two workers."""
    return f"{profile} {options.label}".rstrip()


def figures_of(run: ScaleRun) -> list[PerfFigure]:
    g, name = run.graph, run_name(run.graph.profile.name, run.options)
    shape = f"{g.nodes:,} nodes / {g.edges:,} edges ({g.profile.profile}, {g.profile.features} features)"
    ok = run.status == "completed"
    failure = "" if ok else f"run {run.status}: {run.message}"
    load = run.load_average
    context = (
        f"{shape}; PMP-GCN, ε = {run.options.epsilon:g} visible-batch, batch {run.options.batch_size}; "
        f"{run.options.threads or 'default'} torch thread(s) per service; "
        + (f"party A as W = {run.options.workers} workers (rank 0 in A's process, {run.options.workers - 1} worker "
            "process(es)); "
           if run.options.workers > 1 else "")
        + f"load average {load[0]:.1f} → {load[1]:.1f} on {run.cpus} CPUs"
    )
    phases = "; ".join(
        f"{phase}: " + ", ".join(f"{svc} {_mib(v)}" for svc, v in sorted(per.items()))
        for phase, per in run.max_rss_mib.items()
    )
    a_peak = run.peak_mib.get("party-a", 0.0)
    has_goal = name == GOAL_PROFILE  # one process on the 1M graph: W = 2 is reported
    passed = (ok and a_peak < GOAL_A_PEAK_MIB) if has_goal else None
    cache = (
        f"cold cache: A built its CSR cache in {run.cache_build_seconds:.1f} s during the load"
        if run.options.cold_cache and run.cache_build_seconds is not None else "warm cache"
    )
    out = [
        PerfFigure(
            name=f"scale {name}: party A peak RSS (VmHWM)", value=a_peak, unit="MiB",
            measured=(
                f"{_mib(a_peak)} over A's life ({cache}; {_mib(run.a_load_peak_mib)} by the end of the load; "
                f"{_split(run, 'party-a')}); "
                f"max sampled VmRSS per phase: {phases}; {context}" + (f"; {failure}" if failure else "")
            ),
            goal=f"< {GOAL_A_PEAK_MIB:.0f} MiB" if has_goal else "",
            passed=passed, direction="lower" if has_goal else "none",
            bound="" if passed in (True, None) else (failure or f"largest phase VmRSS: {phases}"),
            command=command_of(run),
        ),
    ]
    if run.worker_peak_mib:
        out.extend(_worker_figures(run, name, a_peak, context, failure))
    for service in ("party-b", "accountant"):
        out.append(PerfFigure(
            name=f"scale {name}: {service} peak RSS (VmHWM)", value=run.peak_mib.get(service, 0.0), unit="MiB",
            measured=(
                f"{_mib(run.peak_mib.get(service, 0.0))} over its life ({_split(run, service)}); {context}"
                + (f"; {failure}" if failure else "")
            ),
            command=command_of(run),
        ))
    rate = run.steps / run.epoch_seconds if run.epoch_seconds > 0 else 0.0
    out.append(PerfFigure(
        name=f"scale {name}: one epoch", value=run.epoch_seconds, unit="s",
        measured=(
            f"{run.steps} steps over B's {g.train_roots:,} training roots (its split: 50 % of the nodes), "
            f"{rate:.1f} steps/s; before it A's load {run.load_seconds:.1f} s ({cache}; a warm open "
            + (f"{run.warm_open_seconds * 1000:.0f} ms" if run.warm_open_seconds is not None else "not measured")
            + f"); after it the evaluation pass over {g.eval_nodes:,} nodes {run.eval_seconds:.1f} s; "
            f"whole run {run.run_seconds:.1f} s; {_phases_text(run)}; {context}" + (f"; {failure}" if failure else "")
        ),
        command=command_of(run),
    ))
    out.append(PerfFigure(
        name=f"scale {name}: generating the graph", value=g.generate_seconds + g.save_seconds, unit="s",
        measured=(
            f"{g.generate_seconds:.1f} s to generate + {g.save_seconds:.1f} s to save, peak RSS "
            f"{g.generate_peak_mib:,.0f} MiB (a child process)" + ("; reused from an earlier run" if g.reused else "")
        ),
        command=f"python -m vesper.benchmarks.perf.scale generate '{g.profile.model_dump_json()}' FILE",
    ))
    return out


def _worker_figures(run: ScaleRun, name: str, a_peak: float, context: str, failure: str) -> list[PerfFigure]:
    """Each of A's worker processes' peak, and party A's whole: rank 0's and the workers' summed."""
    out = [
        PerfFigure(
            name=f"scale {name}: {worker} peak RSS (VmHWM)", value=peak, unit="MiB",
            measured=f"{_mib(peak)} (its VmHWM at its last reading); {context}" + (f"; {failure}" if failure else ""),
            command=command_of(run),
        )
        for worker, peak in sorted(run.worker_peak_mib.items())
    ]
    total = a_peak + sum(run.worker_peak_mib.values())
    parts = " + ".join([f"rank 0 {_mib(a_peak)}"] + [f"{w} {_mib(p)}" for w, p in sorted(run.worker_peak_mib.items())])
    out.append(PerfFigure(
        name=f"scale {name}: party A peak RSS, all its processes", value=total, unit="MiB",
        measured=(
            f"{parts}: the sum of the peaks (each reached at its own time), which counts the pages of the "
            f"memory-mapped CSR and features once per process though the page cache holds them once; {context}"
            + (f"; {failure}" if failure else "")
        ),
        command=command_of(run),
    ))
    return out
