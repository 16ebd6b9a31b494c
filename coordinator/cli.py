"""``vesper``: serve the services, train, read budgets, run the demo."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.table import Table

from vesper.common.config import (
    AccountantConfig,
    ConfigError,
    PartyAConfig,
    PartyBConfig,
    RunConfig,
    RunSummary,
    VesperConfig,
    load_config,
    set_dotted,
    validated,
)
from vesper.common.dataset_files import BUNDLED
from vesper.coordinator.public_facts import with_published_edge_bound
from vesper.coordinator.run_client import format_epsilon

# --help in click's plain layout: at 80 columns every description keeps about 50 columns (the rich
# layout left some 15 beside long option names); no rich markup in help texts
PLAIN_HELP = {"rich_markup_mode": None}
app = typer.Typer(
    help="vesper: train a GNN across two institutions with edge-level differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)
console = Console()
errors = Console(stderr=True)

# interrupted: a peer was lost; the run can be resumed (vesper train --resume RUN)
EXIT_CODES = {"completed": 0, "failed": 1, "refused": 3, "interrupted": 4, "cancelled": 130}


class Service(str, Enum):
    party_a = "party-a"
    party_b = "party-b"
    accountant = "accountant"


class Decoder(str, Enum):
    concat = "concat"
    gru = "gru"


class Accounting(str, Enum):
    visible_batch = "visible-batch"
    hidden_batch = "hidden-batch"


class AccountantChoice(str, Enum):
    pld = "pld"
    rdp = "rdp"


class LabelPrivacy(str, Enum):
    none = "none"
    rr = "rr"
    pate = "pate"


class WireDType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


def _fail(message: str, code: int = 2) -> None:
    errors.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _load(config: Path | None) -> VesperConfig:
    if config is None:
        return VesperConfig()
    try:
        return load_config(config)
    except ConfigError as exc:
        _fail(str(exc))


def _epsilon(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        _fail(f"--epsilon must be a number or inf, got {text!r}")
    return value


def _run_config(base: VesperConfig, overrides: dict[str, Any]) -> RunConfig:
    data = base.run.model_dump(exclude_unset=True) if base.run else {}
    for dotted, value in overrides.items():
        if value is not None:
            set_dotted(data, dotted, value.value if isinstance(value, Enum) else value)
    try:
        return validated(RunConfig, data, "invalid run settings (the [run] section and the flags)", "run")
    except ConfigError as exc:
        _fail(str(exc))


# shared run options of `train` and `demo` -------------------------------------------------------
DatasetOpt = typer.Option(None, "--dataset", help="Bundled name (cora), a name from the parties' [datasets], or an .npz path.")
ExtractorOpt = typer.Option(
    None, "--extractor",
    help="Party A's extractor, a plugin installed at A (`vesper extractors` lists this machine's): "
    "mlp, pmp-gin, pmp-gcn, gap, vfgnn, dpar-edge, dpar-node, ...",
)
ParamOpt = typer.Option(
    None, "--param", "-p",
    help="An extractor hyper-parameter as KEY=VALUE (VALUE read as JSON when it parses, else as text); "
    "repeat for several. `vesper extractors` lists each extractor's.",
)
DecoderOpt = typer.Option(None, "--decoder", help="Party B's decoder.")
EpsilonOpt = typer.Option(None, "--epsilon", help="Edge-level ε budget; 'inf' = no noise and no budget.")
EpochsOpt = typer.Option(None, "--epochs", help="Training epochs.", min=1)
SeedOpt = typer.Option(None, "--seed", help="Root order and initialisation seed (not party A's noise).", min=0)
AccountingOpt = typer.Option(
    None, "--accounting",
    help="visible-batch (default: B sees each batch) or hidden-batch (the paper's Theorem 2.1; assumes B "
    "cannot tell which edges a step used, so it is a reproduction, not a guarantee against B).",
)
AccountantOpt = typer.Option(None, "--accountant", help="Numerical accountant: pld (tighter) or rdp.")
DegreeBoundOpt = typer.Option(
    None, "--degree-bound", help="D of the stable degree projection of A's graph (0 = none).", min=0
)
DeltaOpt = typer.Option(
    None, "--delta",
    help="δ of the edge-level budget, public: declared, never computed from A's graph (default 1e-6, below "
    "1/|E| for graphs of up to a million edges; declare a smaller δ for larger graphs).",
)
EdgeBoundOpt = typer.Option(
    None, "--edge-bound", min=1,
    help="A public upper bound on the number of A's edges, declared by A's operator; rates that need |E| use it "
    "(relational pre-training: q = expected_batch / edge bound), never the exact count.",
)
EdgeRateOpt = typer.Option(
    None, "--edge-sample-rate",
    help="q: A keeps a secret Poisson sample of its edges at this rate per release, credited under visible-batch.",
)
JsonOutOpt = typer.Option(None, "--json-out", help="Write the run summary as JSON to this file.")
BatchOpt = typer.Option(None, "--batch-size", help="Roots per training step.", min=1)
LayersOpt = typer.Option(None, "--layers", help="L, message-passing layers.", min=1)
FanoutOpt = typer.Option(None, "--fanout", help="D, neighbours sampled per node and layer (0 = all).", min=0)
DminOpt = typer.Option(None, "--d-min", help="D_min of truncated PMP-GCN.", min=0)
LrOpt = typer.Option(None, "--lr", help="Learning rate of both parties.")
NoiseOpt = typer.Option(None, "--noise-multiplier", help="Fix z = noise std / sensitivity instead of calibrating it to ε.")
WireOpt = typer.Option(None, "--wire-dtype", help="Dtype of tensors on the wire.")
DimOpt = typer.Option(None, "--dim", help="d, width of every released embedding.", min=1)
DropoutOpt = typer.Option(None, "--dropout", help="Dropout of A's encoder.", min=0.0, max=0.99)
LabelPrivacyOpt = typer.Option(
    None, "--label-privacy",
    help="How party B protects its labels from party A: none, rr (randomised response once, at --label-epsilon) "
    "or pate (DP-GPL: teachers on disjoint groups label queries with Confident-GNMax; A's extractor must not "
    "train with B's labels, e.g. relational). B charges its own ledger, <run id>.labels.",
)
LabelEpsilonOpt = typer.Option(None, "--label-epsilon", help="B's label-level ε budget (needed with rr and pate).")
LabelDeltaOpt = typer.Option(None, "--label-delta", help="δ of B's label ledger (default min(1e-5, 1/labelled training nodes)).")
LabelParamOpt = typer.Option(
    None, "--label-param",
    help="A pate setting as KEY=VALUE: teachers, queries, threshold, sigma1, sigma2, teacher_epochs, teacher_lr, "
    "teacher_weight_decay; repeat for several.",
)
RecordGradientsOpt = typer.Option(
    None, "--record-gradients/--no-record-gradients",
    help="Party A keeps the gradients B sends (first and last epoch) in runs/<id>/gradients.npz, for the "
    "label-leakage measurement.",
)
CanariesOpt = typer.Option(
    None, "--canaries", min=0,
    help="Audit: m candidate canary edges party A plants, each with probability ½ (see vesper audit).",
)
MembershipAuditOpt = typer.Option(
    None, "--membership-audit/--no-membership-audit",
    help="Audit (TFTS): train on the subgraph of B's training nodes, evaluate on the full graph.",
)
RecordReleasesOpt = typer.Option(
    None, "--record-releases/--no-record-releases",
    help="Audit: party B keeps what it received (runs/<id>/received.npz) for vesper audit.",
)


def _overrides(**kw: Any) -> dict[str, Any]:
    return {
        "dataset": kw["dataset"],
        "extractor.name": kw["extractor"],
        "decoder.kind": kw["decoder"],
        "privacy.epsilon": _epsilon(kw["epsilon"]),
        "privacy.accounting": kw["accounting"],
        "privacy.accountant": kw["accountant"],
        "privacy.edge_sample_rate": kw["edge_sample_rate"],
        "privacy.delta": kw["delta"],
        "privacy.edge_bound": kw["edge_bound"],
        "extractor.degree_bound": kw["degree_bound"],
        "epochs": kw["epochs"],
        "seed": kw["seed"],
        "batch_size": kw["batch_size"],
        "extractor.layers": kw["layers"],
        "extractor.fanout": kw["fanout"],
        "extractor.d_min": kw["d_min"],
        "optimizer.lr": kw["lr"],
        "extractor.noise_multiplier": kw["noise_multiplier"],
        "wire_dtype": kw["wire_dtype"],
        "extractor.dim": kw["dim"],
        "extractor.dropout": kw["dropout"],
        **{f"extractor.params.{key}": value for key, value in _params(kw["param"]).items()},
        "label_privacy.mode": kw["label_privacy"],
        "label_privacy.epsilon": _epsilon(kw["label_epsilon"]),
        "label_privacy.delta": kw["label_delta"],
        **{f"label_privacy.pate.{key}": value for key, value in _params(kw["label_param"]).items()},
        "record_gradients": kw["record_gradients"],
        "audit.canaries": kw.get("canaries"),
        "audit.membership": kw.get("membership_audit"),
        "audit.record_releases": kw.get("record_releases"),
    }


def _params(pairs: list[str] | None) -> dict[str, Any]:
    """``--param KEY=VALUE`` pairs; VALUE is JSON when it parses (numbers, true, lists), else text."""
    parsed: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            _fail(f"--param {pair!r}: expected KEY=VALUE with KEY a parameter name")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
    return parsed


def _hidden_batch_numbers(events: float | None, bound6: float | None) -> str:
    return (
        f"hidden-batch: ε from dp-accounting events {format_epsilon(events)}, from the paper's "
        f"bound (6) {format_epsilon(bound6)}; charged the larger."
    )


def _computed_by(s: RunSummary) -> str:
    """What produced the summary's ε: the accountant's name, or why it is not known."""
    if s.accountant:
        return s.accountant
    if s.status == "interrupted" and "accountant" in s.message:
        return "ε as of party A's last receipt: the accountant was lost before the run was closed"
    if s.epsilon_spent > 0 or s.steps:
        return "ε as of party A's last receipt"
    return "no charges"


def print_summaries(summaries: list[RunSummary]) -> None:
    # fits 80 columns; every ε names the accounting that produced it (hidden-batch is no guarantee against B)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("run", "extractor", "status", "test", "ε / budget"):
        table.add_column(column, no_wrap=True)
    short = {"accuracy": "acc", "roc_auc": "auc"}
    for s in summaries:
        metric = f"{short.get(s.test_metric.name, s.test_metric.name)} {s.test_metric.value:.4f}" if s.test_metric else "-"
        table.add_row(
            s.run_id, s.extractor, s.status, metric,
            f"{format_epsilon(s.epsilon_spent)} / {format_epsilon(s.epsilon_budget)} ({s.accounting})",
        )
    console.print(table)
    for s in summaries:
        if s.status != "completed":
            console.print(f"[bold]{s.run_id}[/] {s.status}: {s.message}", highlight=False)
        if s.cost_model == "none":
            noise = "reads no edges, so spends nothing"
        elif s.noise_multiplier and s.cost_model == "one-shot":
            parts = []
            if s.pre_train_releases:
                parts.append(f"{s.pre_train_releases} private pre-training charge{'s' if s.pre_train_releases != 1 else ''} inside A")
            if s.one_shot_releases:
                parts.append(f"{s.one_shot_releases} release{'s' if s.one_shot_releases != 1 else ''}")
            noise = (
                f"noise multiplier z {s.noise_multiplier:.4g} on {' and '.join(parts) or 'nothing'} made once before "
                "training; every training and evaluation release is post-processing of them"
            )
        elif s.noise_multiplier:
            counted = "every release" if s.participation_bound is None else f"{s.participation_bound} per pass"
            once = f"{s.one_shot_releases} releases once, then " if s.one_shot_releases else ""
            form = f"{s.sensitivity_form} " if s.sensitivity_form else ""
            noise = (
                f"noise std θ={s.noise_std:.4g} = z {s.noise_multiplier:.4g} × {form}sensitivity "
                f"{s.sensitivity:.4g}; counted releases: {once}{counted}"
            )
        else:
            noise = "no noise"
        val = f", val {s.val_metric.value:.4f}" if s.val_metric else ""
        console.print(
            f"[bold]{s.run_id}[/] {s.extractor}+{s.decoder} on {s.dataset}, {s.steps} steps in {s.seconds:.1f} s{val}: "
            f"{s.privacy_unit}-level ε spent "
            f"{format_epsilon(s.epsilon_spent)} of {format_epsilon(s.epsilon_budget)} at δ={s.delta:.3g} "
            f"({s.accounting}, {_computed_by(s)}); {noise}"
            + (f". Privacy unit: {s.relation}" if s.relation else ""),
            highlight=False,
        )
        if s.accounting == "hidden-batch":
            console.print(f"  {_hidden_batch_numbers(s.epsilon_events, s.epsilon_bound6)} {s.assumption}", highlight=False)
        if s.status_url:
            console.print(f"  status: {s.status_url}", highlight=False)
        else:
            console.print("  no record at the accountant: the run ended before it was created there; nothing was charged", highlight=False)
        if s.label_privacy != "none" and not s.label_run_id:
            console.print(f"  B's labels ({s.label_privacy}): party B opened no label ledger; nothing was charged", highlight=False)
        elif s.label_privacy != "none":
            spent = "-" if s.label_epsilon_spent is None else format_epsilon(s.label_epsilon_spent)
            budget = "-" if s.label_epsilon_budget is None else format_epsilon(s.label_epsilon_budget)
            delta = "" if s.label_delta is None else f" at δ={s.label_delta:.3g}"
            console.print(
                f"  B's labels ({s.label_privacy}): label-level ε spent {spent} of {budget}{delta}, a separate "
                f"ledger ({s.label_run_id}); privacy unit: one label of one of B's training nodes. {s.label_note}",
                highlight=False,
            )
        else:
            console.print("  B's labels: not protected from party A (--label-privacy none)", highlight=False)


def _write_json(path: Path | None, summary: RunSummary) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary.model_dump_json(indent=2) + "\n")


# commands ------------------------------------------------------------------------------------------
@app.command()
def serve(
    service: Service = typer.Argument(..., help="Which service to run."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with the service's section."),
    listen: Optional[str] = typer.Option(None, "--listen", help="Override the gRPC listen address host:port."),
    ready_file: Optional[Path] = typer.Option(None, "--ready-file", help="Write the bound ports (and torch threads) here as JSON once serving."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run party A, party B or the accountant until SIGINT/SIGTERM."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    cfg = _load(config)
    section = service.value.replace("-", "_")
    settings = getattr(cfg, section)
    if settings is None:
        if config is not None:
            _fail(f"{config} has no [{section}] section")
        settings = {"party_a": PartyAConfig, "party_b": PartyBConfig, "accountant": AccountantConfig}[section]()
    if listen:
        settings = settings.model_copy(update={"listen": listen})
    if settings.tls is not None:  # a missing or broken TLS file stops the service before it listens
        from vesper.common.tls import TlsError, load_material

        try:
            load_material(settings.tls, f"{section}.tls")
        except TlsError as exc:
            _fail(str(exc))
    from vesper.accountant.ledger_store import LedgerFileError
    from vesper.common.writable import SettingError

    try:  # a setting the service cannot run with (an unwritable workdir, a ledger that is not one) stops it here
        if service is Service.party_a:
            from vesper.party_a.service import serve as serve_party_a

            serve_party_a(settings, ready_file)
        elif service is Service.party_b:
            from vesper.party_b.service import serve as serve_party_b

            serve_party_b(settings, ready_file)
        else:
            from vesper.accountant.server import serve as serve_accountant

            serve_accountant(settings, ready_file)
    except (SettingError, LedgerFileError) as exc:
        _fail(str(exc))


@app.command()
def health(
    service: Service = typer.Argument(..., help="Which service to ask."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with the service's section (its listen address and TLS)."),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="Seconds to wait for the answer."),
) -> None:
    """Ask a service's gRPC health check: exit 0 when it is serving, 1 otherwise (container health checks)."""
    from vesper.coordinator.health_check import check_service

    report = check_service(config, service.value, timeout)
    if report.serving:
        console.print(report.line(), highlight=False, markup=False)
        return
    errors.print(report.line(), highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with [run] and [coordinator]."),
    party_a: Optional[str] = typer.Option(None, "--party-a", help="Party A's gRPC address (default: [coordinator].party_a)."),
    dataset: Optional[str] = DatasetOpt,
    extractor: Optional[str] = ExtractorOpt,
    param: Optional[list[str]] = ParamOpt,
    decoder: Optional[Decoder] = DecoderOpt,
    epsilon: Optional[str] = EpsilonOpt,
    epochs: Optional[int] = EpochsOpt,
    seed: Optional[int] = SeedOpt,
    accounting: Optional[Accounting] = AccountingOpt,
    accountant: Optional[AccountantChoice] = AccountantOpt,
    edge_sample_rate: Optional[float] = EdgeRateOpt,
    delta: Optional[float] = DeltaOpt,
    edge_bound: Optional[int] = EdgeBoundOpt,
    degree_bound: Optional[int] = DegreeBoundOpt,
    batch_size: Optional[int] = BatchOpt,
    layers: Optional[int] = LayersOpt,
    fanout: Optional[int] = FanoutOpt,
    d_min: Optional[int] = DminOpt,
    lr: Optional[float] = LrOpt,
    noise_multiplier: Optional[float] = NoiseOpt,
    wire_dtype: Optional[WireDType] = WireOpt,
    dim: Optional[int] = DimOpt,
    dropout: Optional[float] = DropoutOpt,
    label_privacy: Optional[LabelPrivacy] = LabelPrivacyOpt,
    label_epsilon: Optional[str] = LabelEpsilonOpt,
    label_delta: Optional[float] = LabelDeltaOpt,
    label_param: Optional[list[str]] = LabelParamOpt,
    record_gradients: Optional[bool] = RecordGradientsOpt,
    canaries: Optional[int] = CanariesOpt,
    membership_audit: Optional[bool] = MembershipAuditOpt,
    record_releases: Optional[bool] = RecordReleasesOpt,
    json_out: Optional[Path] = JsonOutOpt,
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="RUN",
        help="Continue an interrupted run from party A's last checkpoint, with the settings it started with "
        "(no run options then); the accountant's ledger decides what was already released.",
    ),
) -> None:
    """Train one run against running services, with a live progress bar."""
    from vesper.coordinator.run_client import RunClientError, drive_run

    overrides = _overrides(**locals())
    cfg = _load(config)
    run = None
    if resume:
        given = sorted(key for key, value in overrides.items() if value is not None)
        if given:
            _fail(f"--resume continues a run with the settings it started with; drop {', '.join(given)}")
    else:
        run = _run_config(cfg, overrides)
    address = party_a or (cfg.coordinator.party_a if cfg.coordinator else "127.0.0.1:50051")
    tls = cfg.coordinator.tls if cfg.coordinator else None
    try:
        summary = drive_run(address, run, console, tls=tls, resume_run_id=resume)
    except RunClientError as exc:
        _fail(str(exc), exc.exit_code)
    print_summaries([summary])
    _write_json(json_out, summary)
    raise typer.Exit(EXIT_CODES[summary.status])


def _status_source(url: str | None, config: Path | None, ledger_file: Path | None, ca_file: Path | None = None):
    from vesper.coordinator import status_client

    cfg = _load(config)
    base = url or (cfg.coordinator.accountant_status_url if cfg.coordinator else "http://127.0.0.1:8080")
    if ca_file is None and cfg.coordinator is not None and cfg.coordinator.tls is not None:
        ca_file = cfg.coordinator.tls.ca_file
    if ledger_file is not None:
        if not ledger_file.exists():
            _fail(f"--ledger {ledger_file}: no such file")
        try:
            return status_client.LedgerFile(ledger_file)  # read-only: the audit never writes the file
        except status_client.StatusError as exc:
            _fail(str(exc), 1)
    return status_client.StatusEndpoint(base, ca_file)


UrlOpt = typer.Option(None, "--url", help="The accountant's REST base URL (default: [coordinator].accountant_status_url).")
StatusConfigOpt = typer.Option(None, "--config", "-c", help="TOML file with [coordinator].")
LedgerOpt = typer.Option(None, "--ledger", help="Read a ledger file directly instead of the REST endpoint.")
CaOpt = typer.Option(
    None, "--ca",
    help="The deployment's CA certificate (ca.pem of `vesper certs`) to verify an https status URL "
    "(default: [coordinator].tls.ca_file, else the system's trust store).",
)


def _bounds_text(view) -> str:
    parts = []
    for rule in view.rules:
        bound = "every release" if rule.participation_bound is None else str(rule.participation_bound)
        parts.append(f"{rule.kind} N_e={bound}")
    return ", ".join(parts)


def _print_verification(result) -> None:
    if not result.consistent:
        _fail("ledger does not replay: " + "; ".join(result.problems), 4)
    extra = ""
    if result.epsilon_bound6 is not None:
        extra = f"; events {format_epsilon(result.epsilon_events)}, bound (6) {format_epsilon(result.epsilon_bound6)}"
    console.print(
        f"verified: ε recomputed from {result.charges} ledger rows ({result.counted} counted) = "
        f"{result.epsilon!r} ({result.accountant}{extra}), exactly as recorded", highlight=False,
    )


def _label_ledger(status_client, base, view):
    """B's label ledger of run ``view`` (``<run id>.labels``), if B protected its labels."""
    if view.privacy_unit == "label":
        return None
    try:
        return status_client.run_status(base, f"{view.run_id}.labels")
    except status_client.StatusError:
        return None


def _print_view(view, title: str = "") -> None:
    heading = f"[bold]run {view.run_id}[/] ({view.status}) — {view.extractor}, privacy unit: {view.privacy_unit}"
    console.print(heading + (f" — {title}" if title else ""), highlight=False)
    console.print(
        f"ε spent {format_epsilon(view.epsilon_spent)} of {format_epsilon(view.epsilon_budget)} at δ={view.delta:.3g} "
        f"({view.accounting}, computed by {view.accountant}, requested {view.accountant_requested}); "
        f"{view.charges} charges, {view.counted_charges} counted; {_bounds_text(view)}",
        highlight=False,
    )
    if view.accounting == "hidden-batch":
        console.print(_hidden_batch_numbers(view.epsilon_events, view.epsilon_bound6), highlight=False)
    console.print(f"accounting: {view.assumption}", highlight=False)
    if view.closed_reason:
        console.print(f"closed: {view.closed_reason}", highlight=False)


@app.command()
def status(
    run_id: Optional[str] = typer.Argument(None, help="A run id; without it, list all runs."),
    url: Optional[str] = UrlOpt,
    config: Optional[Path] = StatusConfigOpt,
    ledger_file: Optional[Path] = LedgerOpt,
    ca_file: Optional[Path] = CaOpt,
    verify: bool = typer.Option(False, "--verify", help="Recompute ε locally from the run's ledger and compare (as `vesper ledger verify`)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the run's ε over its releases as a PNG to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the accountant's JSON instead of a table."),
) -> None:
    """Read privacy budgets from the accountant's REST status endpoint."""
    from vesper.coordinator import status_client

    base = _status_source(url, config, ledger_file, ca_file)
    try:
        if run_id is None:
            if plot is not None:
                _fail("--plot needs a run id")
            runs = status_client.list_runs(base)
            if as_json:
                console.print_json(json.dumps([json.loads(r.model_dump_json()) for r in runs]))
                return
            console.print(f"runs at {base}", highlight=False)
            table = Table(box=box.SIMPLE_HEAD)
            for column in ("run", "status", "extractor", "unit", "mode", "ε / budget", "δ", "charges"):
                table.add_column(column, no_wrap=True)
            for r in runs:
                table.add_row(r.run_id, r.status, r.extractor, r.privacy_unit, r.accounting,
                              f"{format_epsilon(r.epsilon_spent)} / {format_epsilon(r.epsilon_budget)}", f"{r.delta:.3g}", str(r.charges))
            console.print(table)
            if any(r.accounting == "hidden-batch" for r in runs):
                console.print("hidden-batch runs assume B cannot tell which edges a step used: no guarantee against B.")
            return
        view = status_client.run_status(base, run_id)
        labels = _label_ledger(status_client, base, view)
        if as_json:
            if labels is None:
                console.print_json(view.model_dump_json())
            else:  # both ledgers, each with its own privacy unit; never one number
                console.print_json(json.dumps({
                    "run": json.loads(view.model_dump_json()), "label_ledger": json.loads(labels.model_dump_json()),
                }))
        else:
            _print_view(view, "party A's ledger" if labels is not None else "")
            if labels is not None:
                console.print()
                _print_view(labels, "party B's label ledger, separate from A's and never added to it")
        if plot is not None:
            from vesper.coordinator.epsilon_plot import plot_epsilon

            plot_epsilon(view, plot)
            console.print(f"wrote {plot}", highlight=False)
        if verify:
            _print_verification(status_client.verify(base, run_id))
    except status_client.StatusError as exc:
        _fail(str(exc), 1)


ledger_app = typer.Typer(help="Audit a run's ledger.", no_args_is_help=True, **PLAIN_HELP)
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("verify")
def ledger_verify(
    run_id: str = typer.Argument(..., help="The run to verify."),
    url: Optional[str] = UrlOpt,
    config: Optional[Path] = StatusConfigOpt,
    ledger_file: Optional[Path] = LedgerOpt,
    ca_file: Optional[Path] = CaOpt,
) -> None:
    """Replay the run's stored DpEvents and reproduce its reported ε exactly (exit 4 if not)."""
    from vesper.coordinator import status_client

    base = _status_source(url, config, ledger_file, ca_file)
    try:
        view = status_client.run_status(base, run_id)
        result = status_client.verify(base, run_id)
    except status_client.StatusError as exc:
        _fail(str(exc), 1)
    if result.consistent and result.charges and result.epsilon != view.epsilon_spent:
        _fail(f"replayed ε {result.epsilon!r} differs from the reported ε {view.epsilon_spent!r}", 4)
    _print_verification(result)
    if view.accounting == "hidden-batch":
        console.print(f"accounting: {view.assumption}", highlight=False)


@app.command()
def audit(
    run_id: str = typer.Argument(..., help="A finished run, trained with audit.record_releases = true."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="TOML file whose [party_a] and [party_b] sections name the workdirs."
    ),
    party_a_workdir: Optional[Path] = typer.Option(None, "--party-a-workdir", help="Party A's workdir (A's summary and canary draw)."),
    party_b_workdir: Optional[Path] = typer.Option(None, "--party-b-workdir", help="Party B's workdir (what B received)."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="The run's .npz (default: the run's dataset name resolved here)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the canary audit's ε lower bound.", min=0.5, max=0.9999),
    seed: int = typer.Option(0, "--seed", help="Seed of the attacks' own sampling (non-edges, shadow set).", min=0),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Attack a finished run from party B's position (docs/audit.md).

    Membership inference (TFTS runs: audit.membership), edge inference from the released
    embeddings, and the one-run canary audit (runs with audit.canaries): its empirical
    lower bound on ε is printed beside the accountant's ε. Exit 5 if the bound exceeds it.
    """
    from vesper.coordinator.audit import AuditError, audit_run

    loaded = _load(config) if config is not None else VesperConfig()
    a_dir = party_a_workdir or (loaded.party_a or PartyAConfig()).workdir
    b_dir = party_b_workdir or (loaded.party_b or PartyBConfig()).workdir
    try:
        report = audit_run(run_id, a_dir, b_dir, dataset=dataset, confidence=confidence, seed=seed)
    except (AuditError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc), 1)
    if as_json:
        console.print_json(report.model_dump_json())
    else:
        _print_audit(report)
    if report.bound_exceeds_accountant:
        raise typer.Exit(5)


def _print_audit(report) -> None:
    console.print(
        f"run {report.run_id}: {report.extractor} on {report.dataset}, {report.accounting}, "
        f"ε spent {format_epsilon(report.epsilon_spent)} of {format_epsilon(report.epsilon_budget)}, δ {report.delta:.3g}",
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("attack", "result", "detail"):
        table.add_column(column)
    if report.edge_inference is not None:
        e = report.edge_inference
        table.add_row("edge inference", f"AUC {e.auc:.3f}", f"{e.positives} edges vs {e.negatives} non-edges")
    if report.membership is not None:
        m = report.membership
        table.add_row(f"membership ({m.attack})", f"AUC {m.auc:.3f}", f"{m.members} members vs {m.non_members} non-members")
    scorers = (
        ("canary audit: B's similarity", report.canaries),
        ("canary audit: replay of the evaluation release", report.canaries_replay),
        ("canary audit: A's noisy aggregates (white box)", report.canaries_mechanism),
        ("canary audit: B's release sums (white box)", report.canaries_release),
    )
    for name, c in scorers:
        if c is not None:
            table.add_row(name, f"ε ≥ {c.epsilon_lower_bound:.3f}", f"{c.correct}/{c.guesses} right of m = {c.m}, confidence {c.confidence:g}"
                          + (" (primary)" if c is report.primary_canary_audit else ""))
    console.print(table)
    for reason in report.skipped:
        console.print(f"skipped {reason}", highlight=False)
    console.print(report.verdict(), style="bold red" if report.bound_exceeds_accountant else None, highlight=False)


@app.command()
def demo(
    dataset: Optional[str] = DatasetOpt,
    extractor: Optional[str] = ExtractorOpt,
    param: Optional[list[str]] = ParamOpt,
    decoder: Optional[Decoder] = DecoderOpt,
    epsilon: Optional[str] = EpsilonOpt,
    epochs: Optional[int] = EpochsOpt,
    seed: Optional[int] = SeedOpt,
    accounting: Optional[Accounting] = AccountingOpt,
    accountant: Optional[AccountantChoice] = AccountantOpt,
    edge_sample_rate: Optional[float] = EdgeRateOpt,
    delta: Optional[float] = DeltaOpt,
    edge_bound: Optional[int] = EdgeBoundOpt,
    degree_bound: Optional[int] = DegreeBoundOpt,
    batch_size: Optional[int] = BatchOpt,
    layers: Optional[int] = LayersOpt,
    fanout: Optional[int] = FanoutOpt,
    d_min: Optional[int] = DminOpt,
    lr: Optional[float] = LrOpt,
    noise_multiplier: Optional[float] = NoiseOpt,
    wire_dtype: Optional[WireDType] = WireOpt,
    dim: Optional[int] = DimOpt,
    dropout: Optional[float] = DropoutOpt,
    label_privacy: Optional[LabelPrivacy] = LabelPrivacyOpt,
    label_epsilon: Optional[str] = LabelEpsilonOpt,
    label_delta: Optional[float] = LabelDeltaOpt,
    label_param: Optional[list[str]] = LabelParamOpt,
    record_gradients: Optional[bool] = RecordGradientsOpt,
    json_out: Optional[Path] = JsonOutOpt,
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with a [run] section to start from."),
    workdir: Path = typer.Option(Path(".vesper/demo"), "--workdir", help="Configs, logs, ledger and models of the demo."),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline", help="Also train the MLP extractor (no edges) to compare."),
    keep_serving: bool = typer.Option(False, "--keep-serving", help="Leave the services running until Ctrl-C."),
) -> None:
    """Start the three services on loopback, train, evaluate, report, shut down."""
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    cfg = _load(config)
    overrides = _overrides(**locals())
    chosen = extractor is not None or (cfg.run is not None and "extractor" in cfg.run.model_fields_set)
    if label_privacy == LabelPrivacy.pate and not chosen:
        overrides["extractor.name"] = "relational"  # a frozen encoder A trains without B's labels
        console.print("label privacy pate: party A uses the relational extractor (pre-trained without B's labels)")
    run = _run_config(cfg, overrides)
    if run.extractor.name in ("relational", "relational-gap") and run.privacy.edge_bound is None and run.dataset in BUNDLED:
        run = with_published_edge_bound(run)  # the bundled graph is public: its published size is a public bound
        console.print(f"{run.dataset}: its published {run.privacy.edge_bound:,} edges declared as privacy.edge_bound")
    if baseline and run.label_privacy.mode == "pate":
        baseline = False
        console.print("label privacy pate: no MLP baseline (its encoder would be frozen untrained)")
    console.print(f"starting the accountant, party B and party A on loopback (logs in {workdir / 'logs'})")
    try:
        with LocalCluster(workdir.resolve()) as cluster:
            console.print(f"accountant status: {cluster.status_url}/v1/runs", highlight=False)
            summary = drive_run(cluster.party_a_address, run, console)
            if baseline and run.extractor.name != "mlp":
                mlp = run.model_copy(update={"extractor": run.extractor.model_copy(update={"name": "mlp", "params": {}})})
                summary = summary.model_copy(update={"baseline": drive_run(cluster.party_a_address, mlp, console)})
            print_summaries([summary] + ([summary.baseline] if summary.baseline else []))
            _write_json(json_out, summary)
            if keep_serving:
                console.print("services keep running; press Ctrl-C to stop them")
                try:
                    cluster.services["accountant"].process.wait()
                except KeyboardInterrupt:
                    pass
            else:
                console.print(
                    f"the services stop now; the ledger stays in {cluster.ledger} (the accountant moves every charge "
                    "into that file when it stops, so the file alone is the whole ledger). To read it again: "
                    f"vesper ledger verify {summary.run_id} --ledger {cluster.ledger}", highlight=False,
                )
    except (ServiceStartError, RunClientError) as exc:
        _fail(str(exc), getattr(exc, "exit_code", 1))
    raise typer.Exit(EXIT_CODES[summary.status])


@app.command("extractors")
def extractors_command(
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List the extractors installed on this machine: privacy unit, cost model, hyper-parameters.

    Party A runs the extractor, so what counts is what is installed where A runs; a
    third-party package adds one under the `vesper.extractors` entry-point group.
    """
    from vesper.party_a.extractors.registry import describe_params, installed

    found = installed()
    if as_json:
        rows = []
        for item in found:
            row: dict[str, Any] = {"name": item.name, "source": item.source, "distribution": item.distribution}
            if item.extractor is None:
                row["error"] = item.error
            else:
                spec = item.extractor.spec
                row.update({
                    "privacy_unit": spec.privacy_unit, "cost_model": spec.cost_model, "summary": spec.summary,
                    "accountings": list(spec.accountings), "edge_sampling": spec.edge_sampling,
                    "uses": list(spec.uses), "docs": spec.docs,
                    "params": [{"name": n, "default": d, "description": t} for n, d, t in describe_params(spec.params)],
                })
            rows.append(row)
        console.print_json(json.dumps(rows))
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("name", "privacy unit", "cost model", "accounting"):
        table.add_column(column, no_wrap=True)
    for item in found:
        if item.extractor is None:
            table.add_row(item.name, "-", "-", "[red]unavailable[/]")
            continue
        spec = item.extractor.spec
        table.add_row(spec.name, spec.privacy_unit, spec.cost_model, ", ".join(spec.accountings))
    console.print(table)
    for item in found:
        if item.extractor is None:
            console.print(f"[bold]{item.name}[/] ({item.source}) is unavailable: {item.error}", highlight=False)
            continue
        spec = item.extractor.spec
        console.print(f"[bold]{spec.name}[/]: {spec.summary}", highlight=False)
        shared = ", ".join(spec.uses) or "none"
        console.print(f"  from {item.distribution}; docs {spec.docs or '-'}; reads extractor.{{{shared}}}", highlight=False)
        for name, default, description in describe_params(spec.params):
            console.print(f"  --param {name}=…  (default {default}) {description}", highlight=False)


bench_app = typer.Typer(help="Benchmarks: commands that measure, not tests.", no_args_is_help=True, **PLAIN_HELP)
app.add_typer(bench_app, name="bench")


@bench_app.command("accounting")
def bench_accounting(
    steps: list[int] = typer.Option([1000, 10000], "--steps", help="Run lengths to calibrate (repeat the flag).", min=1),
) -> None:
    """Time and peak memory of calibrating long runs under the pld and rdp accountants."""
    from vesper.accountant.benchmark import main as run_benchmark

    run_benchmark(steps)


@bench_app.command("extractors")
def bench_extractors(
    dataset: list[str] = typer.Option(["cora"], "--dataset", help="A bundled name or an .npz path (repeat the flag)."),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors to compare (repeat; default mlp, pmp-gin, pmp-gcn, gap, vfgnn, dpar-edge)."
    ),
    seeds: int = typer.Option(5, "--seeds", help="Seeds per cell (0, 1, ...).", min=1),
    epsilon: list[str] = typer.Option(
        ["4"], "--epsilon", help="Budget of the runs; 'inf' = no noise. Repeat for a sweep: a column per ε."
    ),
    accounting: Accounting = typer.Option(Accounting.visible_batch, "--accounting", help="Accounting mode of every run."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs (default: the [run] section's, else 50).", min=1),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file whose [run] section every run starts from."),
    out: Path = typer.Option(Path("bench/extractors"), "--out", help="Directory for results.csv, results.md and results.png."),
    jobs: int = typer.Option(1, "--jobs", help="Runs at a time, each with its own services on loopback.", min=1),
    party_a: Optional[str] = typer.Option(
        None, "--party-a", help="Use running services at this party A address instead of starting them on loopback."
    ),
) -> None:
    """Extractors side by side (mean ± std over seeds), through the real services.

    One --epsilon: a table at that budget. Several: a table per dataset with a column per ε
    and a plot of the metric against ε; an extractor that reads no edge (the MLP) runs once
    per seed and is shown in every column. Resumable: cells already in OUT/results.csv are
    not run again.
    """
    from vesper.coordinator import extractor_table as table
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    budgets = list(dict.fromkeys(_epsilon(e) for e in epsilon))
    base = _run_config(_load(config), {
        "privacy.epsilon": budgets[0], "privacy.accounting": accounting, "epochs": epochs,
    })
    names = extractor or list(table.DEFAULT_EXTRACTORS)
    command = " ".join(
        ["vesper bench extractors", *(f"--dataset {d}" for d in dataset), *(f"--extractor {e}" for e in names),
         f"--seeds {seeds}", *(f"--epsilon {e}" for e in epsilon), f"--accounting {accounting.value}",
         f"--epochs {base.epochs}"]
    )
    if len(budgets) > 1 or jobs > 1:
        _bench_sweep(base, budgets, dataset, names, seeds, out, jobs, party_a, command)
        return

    def report(rows: list[table.TableRow]) -> None:
        (out / "results.md").write_text(table.markdown(rows, base, seeds, command) + "\n")
        table.plot(rows, out / "results.png")
        console.print((out / "results.md").read_text(), highlight=False)
        console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'} and {out / 'results.png'}", highlight=False)

    try:
        if party_a is not None:
            rows = table.run_table(base, dataset, names, seeds, out, lambda c: drive_run(party_a, c, console), console)
        else:
            with LocalCluster((out / "cluster").resolve()) as cluster:
                rows = table.run_table(
                    base, dataset, names, seeds, out, lambda c: drive_run(cluster.party_a_address, c, console), console
                )
    except (ServiceStartError, RunClientError) as exc:
        _fail(str(exc), getattr(exc, "exit_code", 1))
    report(rows)


def _bench_sweep(
    base: RunConfig, budgets: list[float], datasets: list[str], names: list[str], seeds: int, out: Path, jobs: int,
    party_a: str | None, command: str,
) -> None:
    from contextlib import ExitStack

    from vesper.coordinator import extractor_sweep as sweep
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    def driver(address: str) -> Callable[[RunConfig], RunSummary]:
        return lambda config: drive_run(address, config, console)

    try:
        with ExitStack() as stack:
            if party_a is not None:
                drivers = [driver(party_a)] * jobs
            else:
                clusters = [stack.enter_context(LocalCluster((out / f"cluster-{i}").resolve())) for i in range(jobs)]
                drivers = [driver(c.party_a_address) for c in clusters]
            rows = sweep.run_sweep(base, budgets, datasets, names, seeds, out, drivers, console)
    except (ServiceStartError, RunClientError) as exc:
        _fail(str(exc), getattr(exc, "exit_code", 1))
    (out / "results.md").write_text(sweep.markdown(rows, base, budgets, seeds, command) + "\n")
    sweep.plot(rows, budgets, out / "results.png")
    console.print((out / "results.md").read_text(), highlight=False)
    console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'} and {out / 'results.png'}", highlight=False)


def _label_privacy_command():
    from vesper.coordinator.label_privacy_table import label_privacy_command

    return label_privacy_command


bench_app.command("label-privacy")(_label_privacy_command())


def _audit_bench_command():
    from vesper.coordinator.audit_bench import audit_bench_command

    return audit_bench_command


bench_app.command("audit")(_audit_bench_command())


def _utility_command():
    from vesper.coordinator.utility_bench import utility_command

    return utility_command


bench_app.command("utility")(_utility_command())


def _results_command():
    from vesper.coordinator.results_report import results_command

    return results_command


bench_app.command("results")(_results_command())


def _soak_command():
    from vesper.coordinator.soak_bench import soak_command

    return soak_command


bench_app.command("soak")(_soak_command())


def _perf_command():
    from vesper.coordinator.perf.command import perf_command

    return perf_command


bench_app.command("perf")(_perf_command())


@bench_app.command("snr")
def bench_snr(
    dataset: str = typer.Option("cora", "--dataset", help="A bundled name or an .npz path."),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors to profile (repeat; default pmp-gin, pmp-gcn, gap)."
    ),
    epsilon: str = typer.Option("4", "--epsilon", help="The run's budget, for calibrating z."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file whose [run] section sets the run (epochs, dim, fanout, ...)."),
    dim: Optional[int] = typer.Option(None, "--dim", help="d, width of every released embedding.", min=1),
    fanout: Optional[int] = typer.Option(None, "--fanout", help="D, neighbours sampled per node and layer (0 = all).", min=0),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs of the planned run.", min=1),
) -> None:
    """Neighbourhood signal against noise per degree, at the z the accountant would calibrate.

    Local and free: nothing is released or charged. Shows where an extractor's noisy
    aggregate can carry information (signal norm above the noise norm θ√d).
    """
    from vesper.common.dataset_files import DatasetError, resolve_dataset
    from vesper.coordinator.signal_to_noise import profile

    run = _run_config(_load(config), {
        "privacy.epsilon": _epsilon(epsilon), "extractor.dim": dim, "extractor.fanout": fanout, "epochs": epochs,
    })
    try:
        path = resolve_dataset(dataset)
    except DatasetError as exc:
        _fail(str(exc))
    for name in extractor or ["pmp-gin", "pmp-gcn", "gap"]:
        try:
            found = profile(run, path, name)
        except (ValueError, KeyError) as exc:
            errors.print(f"{name}: cannot profile: {exc}")
            continue
        table = Table(box=box.SIMPLE_HEAD, title=(
            f"{name} on {dataset} at ε={epsilon}, {run.epochs} epochs: z={found.noise_multiplier:.3g}, "
            f"θ={found.noise_std:.3g}, d={found.dim}"
        ))
        for column in ("degree", "nodes", "mean ‖a_v‖", "noise θ√d", "signal/noise", "nodes above noise"):
            table.add_column(column, justify="right")
        for b in found.buckets:
            degree = str(b.low) if b.low == b.high else (f"{b.low}–{b.high}" if b.high < 10**9 else f"≥{b.low}")
            table.add_row(
                degree, str(b.nodes), f"{b.signal:.3g}", f"{b.noise:.3g}", f"{b.signal / b.noise:.3f}",
                f"{100 * b.readable:.1f} %",
            )
        console.print(table)


@app.command()
def certs(
    out: Path = typer.Option(..., "--out", metavar="DIR", help="Directory for ca.pem, ca.key and ROLE.pem / ROLE.key of every role."),
    host: Optional[list[str]] = typer.Option(
        None, "--host", metavar="ROLE=NAME",
        help="ROLE=NAME: a DNS name or IP address the ROLE's certificate answers to (repeat for several; a role "
        "named here gets exactly the names given, the others localhost and 127.0.0.1). Roles: accountant, "
        "party-a, party-b, coordinator.",
    ),
    role: Optional[list[str]] = typer.Option(
        None, "--role", metavar="ROLE",
        help="Issue only this role's certificate (repeat for several), signed by the CA already in --out: "
        "rotates one party's certificate without a new CA.",
    ),
    days: int = typer.Option(365, "--days", min=1, max=3650, help="Validity of every certificate issued, in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Make the deployment's CA and a mutual-TLS certificate per role (docs/tls.md)."""
    from vesper.coordinator.certs import (
        RECIPIENTS,
        ROLES,
        CertificateError,
        CertificatePlan,
        make_certificates,
        parse_host_options,
    )

    try:
        unknown = [name for name in role or [] if name not in ROLES]
        if unknown:
            raise CertificateError(f"unknown role {unknown[0]!r}; roles are {', '.join(ROLES)}")
        plan = CertificatePlan(roles=tuple(role or ROLES), hosts=parse_host_options(host or []), days=days)
        issued = make_certificates(out, plan, force=force)
    except (CertificateError, ValidationError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot write certificates to {out}: {exc}")
    if issued.ca_created:
        console.print(f"{out / 'ca.pem'}, {out / 'ca.key'}: the CA; ca.key stays here, ca.pem goes to every party", highlight=False, soft_wrap=True)
    for name in issued.roles:
        cert, key = issued.files_of(name)
        console.print(
            f"{cert}, {key}: role {name}, names {', '.join(issued.names[name])} -> {RECIPIENTS[name]}", highlight=False, soft_wrap=True
        )
    console.print(f"valid until {issued.not_valid_after:%Y-%m-%d %H:%M} UTC; keys are 0600", highlight=False)


data_app = typer.Typer(help="Data sets: make synthetic graphs.", no_args_is_help=True, **PLAIN_HELP)
app.add_typer(data_app, name="data")


class Profile(str, Enum):
    dense = "dense"
    sparse = "sparse"


@data_app.command("synth")
def data_synth(
    out: Path = typer.Argument(..., help="Where to write the .npz (heterophily layout, like Tolokers)."),
    nodes: int = typer.Option(2000, "--nodes", help="Number of nodes.", min=2),
    profile: Profile = typer.Option(Profile.sparse, "--profile", help="dense: every node has edges; sparse: about half are isolated."),
    mean_degree: Optional[float] = typer.Option(None, "--mean-degree", help="2|E|/N over all nodes (default: 40 dense, 2.2 sparse)."),
    classes: int = typer.Option(2, "--classes", help="Number of classes.", min=2),
    features: int = typer.Option(16, "--features", help="Feature dimension.", min=1),
    homophily: float = typer.Option(0.8, "--homophily", help="Fraction of edges joining two nodes of the same class."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generator.", min=0),
) -> None:
    """Generate a contextual stochastic block model graph with a chosen degree profile."""
    from vesper.coordinator.synthetic import SyntheticSpec, generate, save_npz

    try:
        spec = SyntheticSpec(
            num_nodes=nodes, num_classes=classes, num_features=features, profile=profile.value,
            mean_degree=mean_degree, homophily=homophily, seed=seed,
        )
        graph = generate(spec)
    except ValueError as exc:
        _fail(str(exc))
    save_npz(graph, out)
    degree = 2 * graph.num_edges / graph.num_nodes
    console.print(f"wrote {out}: {graph.num_nodes} nodes, {graph.num_edges} edges (mean degree {degree:.2f}), {classes} classes")


def main() -> None:
    app()
