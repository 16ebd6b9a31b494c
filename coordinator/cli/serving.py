"""`vesper align` and `vesper predict`: private id alignment, and scores of a finished run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from vesper.coordinator.cli.shared import console, fail, load_settings

ConfigOpt = typer.Option(None, "--config", "-c", help="TOML file with a [coordinator] section (addresses, TLS).")
PartyAOpt = typer.Option(None, "--party-a", help="Party A's gRPC address (default: [coordinator].party_a).")
PartyBOpt = typer.Option(None, "--party-b", help="Party B's gRPC address (default: [coordinator].party_b).")


def align(
    dataset: str = typer.Option(
        ..., "--dataset",
        help="The stores to align: the name both parties give their `vesper data import` store in [datasets].",
    ),
    name: Optional[str] = typer.Option(
        None, "--name", help="The aligned dataset's id, used as --dataset by train and predict (default: DATASET-aligned).",
    ),
    pad_to: int = typer.Option(
        0, "--pad-to", min=0,
        help="Party A sends this many blinded keys (at least its node count); 0 = party A's setting, else the next "
        "power of two.",
    ),
    party_a: Optional[str] = PartyAOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Find which of party B's keys are nodes of party A's graph, privately (docs/alignment.md).

    A Diffie-Hellman private set intersection over Ristretto255 between the two services: neither
    party learns the other's keys outside the intersection. Both keep the shared index, so runs
    on the aligned dataset (--dataset ID) never need the keys again.
    """
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import align as align_with

    cfg = load_settings(config)
    alignment_id = name or f"{dataset}-aligned"
    address = party_a or (cfg.coordinator.party_a if cfg.coordinator else "127.0.0.1:50051")
    try:
        report = json.loads(align_with(address, dataset, alignment_id, console, cfg.coordinator.tls if cfg.coordinator else None, pad_to))
    except RunClientError as exc:
        fail(str(exc), exc.exit_code)
    console.print(
        f"aligned {dataset}: {report['size']:,} keys in the intersection, in {report['seconds']:.1f} s. "
        f"Train with --dataset {report['alignment_id']}; party B's keys that party A's graph does not hold are "
        "listed at party B only (its workdir, alignments/<id>/unmatched_keys.csv)."
    )


def read_keys(path: Path, column: str) -> list[str]:
    """The ``column`` of a CSV or Parquet file, as text."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types={column: pa.string()}))
        elif suffix in (".parquet", ".pq"):
            table = pq.read_table(path)
        else:
            fail(f"--keys {path}: a .csv or .parquet file is expected")
    except (OSError, pa.ArrowInvalid) as exc:
        fail(f"--keys {path}: cannot read it: {exc}")
    if column not in table.column_names:
        fail(f"--keys {path}: no column {column!r} (it has {', '.join(table.column_names)}); name it with --key")
    values = table.column(column).cast(pa.string())
    if values.null_count:
        fail(f"--keys {path}: column {column!r} has {values.null_count} empty values")
    return values.to_pylist()


def predict(
    run: str = typer.Argument(..., help="A completed run's id."),
    keys: Optional[Path] = typer.Option(None, "--keys", help="CSV or Parquet of the keys to score (column --key)."),
    key: str = typer.Option("id", "--key", help="The key column of --keys."),
    all_keys: bool = typer.Option(False, "--all", help="Score every key of the run's dataset (its shared index)."),
    out: Path = typer.Option(..., "--out", help="The scores file: .csv or .parquet (key, predicted, p_<class> ...)."),
    party_a: Optional[str] = PartyAOpt,
    party_b: Optional[str] = PartyBOpt,
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Score keys with a finished run: predicted class and every class's probability, from party B.

    Party A releases every node of the run's dataset once (a prediction pass, charged before it is
    sent unless its releases are post-processing: docs/privacy.md, section 2.4); party B keeps the
    probabilities, so later requests are free. Run it where party B's outputs may go.
    """
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import check_keys, prediction_pass, score_request, write_scores

    if (keys is None) == (not all_keys):
        fail("name the keys to score: --keys FILE or --all")
    cfg = load_settings(config)
    tls = cfg.coordinator.tls if cfg.coordinator else None
    address_a = party_a or (cfg.coordinator.party_a if cfg.coordinator else "127.0.0.1:50051")
    address_b = party_b or (cfg.coordinator.party_b if cfg.coordinator else "127.0.0.1:50052")
    request = score_request(run, read_keys(keys, key) if keys is not None else None, all_keys)
    try:
        plan = check_keys(address_b, request, tls)
        if not plan.predicted:
            report = json.loads(prediction_pass(address_a, run, console, tls))
            charged = f"charged, ε spent {report['epsilon_spent']:.4g}" if report["charged"] else "post-processing, free"
            console.print(f"prediction pass {report['pass_index']} of run {run}: {report['nodes']:,} nodes ({charged})")
        rows = write_scores(address_b, request, out, tls)
    except RunClientError as exc:
        fail(str(exc), exc.exit_code)
    console.print(f"wrote {rows:,} scores to {out}")
