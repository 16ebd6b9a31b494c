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
    LogFormatOpt,
    LrOpt,
    MembershipAuditOpt,
    NoiseOpt,
    ParamOpt,
    PathEpochsOpt,
    PredictionPassesOpt,
    RecordGradientsOpt,
    RecordReleasesOpt,
    SeedOpt,
    WireDType,
    WireOpt,
    check_log_format,
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
    prediction_passes: Optional[int] = PredictionPassesOpt,
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
    edge_free_path_epochs: Optional[int] = PathEpochsOpt,
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


WorkersOpt = typer.Option(
    1, "--workers", min=1,
    help="Party A's processes (party_a.workers): W share each release's roots, with the same releases and "
    "ledger as 1. The per-step extractors (mlp, pmp-gin, pmp-gcn) and GAP's hops (gap, relational-gap).",
)


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
    prediction_passes: Optional[int] = PredictionPassesOpt,
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
    edge_free_path_epochs: Optional[int] = PathEpochsOpt,
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
    party_a_data: Optional[Path] = typer.Option(
        None, "--party-a-data", help="Party A's store (vesper data import --role party-a): align it with --party-b-data and train on it.",
    ),
    party_b_data: Optional[Path] = typer.Option(None, "--party-b-data", help="Party B's store (vesper data import --role party-b)."),
    predict_out: Optional[Path] = typer.Option(
        None, "--predict-out",
        help="After training, score party B's unlabelled keys of the dataset (or every key, with --all) into this "
        ".csv or .parquet file.",
    ),
    all_keys: bool = typer.Option(False, "--all", help="With --predict-out: score every key, not only B's unlabelled ones."),
    log_format: str = LogFormatOpt,
    workers: int = WorkersOpt,
) -> None:
    """Start the three services on loopback, train, evaluate, report, shut down.

    With --party-a-data and --party-b-data: your own files (vesper data import), aligned privately
    first (vesper align); with --predict-out: the scores of the trained model too."""
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    check_log_format(log_format)
    cfg = load_settings(config)
    overrides = run_overrides(**locals())
    own = own_data(party_a_data, party_b_data, workers)
    if predict_out is not None and prediction_passes is None:
        overrides["privacy.prediction_passes"] = 1  # reserved: free unless the extractor's evaluation is charged
    run, baseline = demo_settings(cfg, overrides, extractor, label_privacy, baseline)
    console.print(f"starting the accountant, party B and party A on loopback (logs in {workdir / 'logs'})")
    try:
        with LocalCluster(workdir.resolve(), log_format=log_format, **own) as cluster:
            console.print(f"accountant status: {cluster.status_url}/v1/runs", highlight=False)
            if party_a_data is not None:  # the run trains on the aligned dataset
                run = run.model_copy(update={"dataset": align_own_data(cluster)})
            summary = drive_run(cluster.party_a_address, run, console)
            if predict_out is not None and summary.status == "completed":
                score_run(cluster, summary.run_id, predict_out, all_keys)
            if baseline and run.extractor.name != "mlp":
                mlp = run.model_copy(update={"extractor": run.extractor.model_copy(update={"name": "mlp", "params": {}})})
                summary = summary.model_copy(update={"baseline": drive_run(cluster.party_a_address, mlp, console)})
            print_summaries([summary] + ([summary.baseline] if summary.baseline else []))
            write_json(json_out, summary)
            _after_demo(cluster, summary.run_id, keep_serving)
    except (ServiceStartError, RunClientError) as exc:
        fail(str(exc), getattr(exc, "exit_code", 1))
    raise typer.Exit(EXIT_CODES[summary.status])


OWN = "own"  # the name both parties give their store in the demo's [datasets]


def own_data(party_a_data: Path | None, party_b_data: Path | None, workers: int = 1) -> dict:
    """LocalCluster's settings for the parties' own stores (none without them), and party A's
    worker processes (``--workers``: party_a.workers)."""
    if (party_a_data is None) != (party_b_data is None):
        fail("your own data needs both stores: --party-a-data DIR and --party-b-data DIR")
    processes = {"workers": workers} if workers > 1 else {}
    if party_a_data is None:
        return {"party_a": processes} if processes else {}
    return {
        "party_a": {"datasets": {OWN: str(party_a_data.resolve())}, **processes},
        "party_b": {"datasets": {OWN: str(party_b_data.resolve())}},
    }


def align_own_data(cluster: object) -> str:
    """The demo's private id alignment of the two stores (vesper align); the aligned dataset's id."""
    import json
    import secrets

    from vesper.coordinator.serving_client import align

    report = json.loads(align(cluster.party_a_address, OWN, f"{OWN}-{secrets.token_hex(4)}", console))
    console.print(f"aligned the parties' keys: {report['size']:,} in the intersection ({report['alignment_id']})")
    return report["alignment_id"]


def score_run(cluster: object, run_id: str, out: Path, all_keys: bool) -> None:
    """The demo's `vesper predict`: B's unlabelled keys (or all) scored into ``out``."""
    import json

    from vesper.coordinator.serving_client import check_keys, prediction_pass, score_request, write_scores

    request = score_request(run_id, None, all_keys)
    plan = check_keys(cluster.party_b_address, request)
    if not plan.predicted:
        report = json.loads(prediction_pass(cluster.party_a_address, run_id, console))
        console.print(f"prediction pass: {report['nodes']:,} nodes ({'charged' if report['charged'] else 'free'})")
    rows = write_scores(cluster.party_b_address, request, out)
    console.print(f"wrote {rows:,} scores ({'every key' if all_keys else 'party B unlabelled keys'}) to {out}")


def demo_settings(cfg, overrides: dict, extractor: str | None, label_privacy, baseline: bool):  # noqa: ANN001, ANN202
    """The demo's run settings, and whether it also trains the MLP baseline."""
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
    return run, baseline


def _after_demo(cluster: object, run_id: str, keep_serving: bool) -> None:
    if keep_serving:
        console.print("services keep running; press Ctrl-C to stop them")
        try:
            cluster.services["accountant"].process.wait()
        except KeyboardInterrupt:
            pass
        return
    console.print(
        f"the services stop now; the ledger stays in {cluster.ledger} (the accountant moves every charge "
        "into that file when it stops, so the file alone is the whole ledger). To read it again: "
        f"vesper ledger verify {run_id} --ledger {cluster.ledger}", highlight=False,
    )
