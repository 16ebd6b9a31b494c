"""`vesper train` and `vesper demo`: one run against running services, or the demo on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vesper.common.dataset_files import BUNDLED
from vesper.coordinator.cli.shared import (
    EXIT_CODES,
    AccountantChoice,
    AccountantOpt,
    Accounting,
    AccountingOpt,
    BatchOpt,
    CanariesOpt,
    DatasetOpt,
    Decoder,
    DecoderOpt,
    DegreeBoundOpt,
    DeltaOpt,
    DimOpt,
    DminOpt,
    DropoutOpt,
    EdgeBoundOpt,
    EdgeRateOpt,
    EpochsOpt,
    EpsilonOpt,
    ExtractorOpt,
    FanoutOpt,
    JsonOutOpt,
    LabelDeltaOpt,
    LabelEpsilonOpt,
    LabelParamOpt,
    LabelPrivacy,
    LabelPrivacyOpt,
    LayersOpt,
    LrOpt,
    MembershipAuditOpt,
    NoiseOpt,
    ParamOpt,
    RecordGradientsOpt,
    RecordReleasesOpt,
    SeedOpt,
    WireDType,
    WireOpt,
    console,
    fail,
    load_settings,
    run_overrides,
    run_settings,
)
from vesper.coordinator.cli.summaries import print_summaries, write_json
from vesper.coordinator.public_facts import with_published_edge_bound


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

    overrides = run_overrides(**locals())
    cfg = load_settings(config)
    run = None
    if resume:
        given = sorted(key for key, value in overrides.items() if value is not None)
        if given:
            fail(f"--resume continues a run with the settings it started with; drop {', '.join(given)}")
    else:
        run = run_settings(cfg, overrides)
    address = party_a or (cfg.coordinator.party_a if cfg.coordinator else "127.0.0.1:50051")
    tls = cfg.coordinator.tls if cfg.coordinator else None
    try:
        summary = drive_run(address, run, console, tls=tls, resume_run_id=resume)
    except RunClientError as exc:
        fail(str(exc), exc.exit_code)
    print_summaries([summary])
    write_json(json_out, summary)
    raise typer.Exit(EXIT_CODES[summary.status])


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

    cfg = load_settings(config)
    overrides = run_overrides(**locals())
    chosen = extractor is not None or (cfg.run is not None and "extractor" in cfg.run.model_fields_set)
    if label_privacy == LabelPrivacy.pate and not chosen:
        overrides["extractor.name"] = "relational"  # a frozen encoder A trains without B's labels
        console.print("label privacy pate: party A uses the relational extractor (pre-trained without B's labels)")
    run = run_settings(cfg, overrides)
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
            write_json(json_out, summary)
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
        fail(str(exc), getattr(exc, "exit_code", 1))
    raise typer.Exit(EXIT_CODES[summary.status])
