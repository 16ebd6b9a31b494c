"""The coordinator's side of alignment and prediction: ask party A to align or to run a
prediction pass (progress shown live), ask party B for the scores, write the scores file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vesper.common.config import TlsConfig
from vesper.common.grpc_server import channel_options
from vesper.common.tls import TlsError, open_channel
from vesper.coordinator.run_client import RunClientError, format_epsilon
from vesper.proto.v1 import graph_party_pb2 as gp_pb
from vesper.proto.v1 import graph_party_pb2_grpc as gp_grpc
from vesper.proto.v1 import label_party_pb2 as lp_pb
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc

SCORE_FORMATS = (".csv", ".parquet", ".pq")


def _channel(address: str, tls: TlsConfig | None, max_message_mb: int = 64) -> grpc.Channel:
    try:
        return open_channel(address, tls, channel_options(max_message_mb), setting="coordinator.tls")
    except TlsError as exc:
        raise RunClientError(str(exc)) from None


def _follow(call: Iterator[gp_pb.RunEvent], title: str, console: Console, party: str, address: str) -> str:
    """Show the job's progress; return its result JSON (RunClientError on a refusal)."""
    columns = (
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("ε {task.fields[eps]}"), TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(title, total=None, eps="-")
            for event in call:
                if event.HasField("result_json"):
                    return event.result_json
                p = event.progress
                progress.update(
                    task, description=p.message or title, total=p.total_steps or None, completed=p.step,
                    eps=format_epsilon(p.epsilon_spent) if p.phase == "predict" else "-",
                )
    except grpc.RpcError as error:
        raise RunClientError(f"party {party} at {address} refused: {error.code().name}: {error.details()}") from None
    raise RunClientError(f"party {party} at {address} ended without a result")


def align(party_a: str, dataset: str, alignment_id: str, console: Console, tls: TlsConfig | None = None,
          pad_to: int = 0) -> str:
    """Party A aligns its store ``dataset`` with party B's; the report's JSON."""
    with _channel(party_a, tls) as channel:
        call = gp_grpc.GraphPartyStub(channel).Align(
            gp_pb.AlignRequest(dataset=dataset, alignment_id=alignment_id, pad_to=pad_to)
        )
        return _follow(call, f"aligning {dataset} as {alignment_id}", console, "A", party_a)


def prediction_pass(party_a: str, run_id: str, console: Console, tls: TlsConfig | None = None) -> str:
    """Party A's prediction pass of ``run_id``; the report's JSON."""
    with _channel(party_a, tls) as channel:
        call = gp_grpc.GraphPartyStub(channel).Predict(gp_pb.PredictRequest(run_id=run_id))
        return _follow(call, f"prediction pass of {run_id}", console, "A", party_a)


def score_request(run_id: str, keys: list[str] | None, select_all: bool) -> lp_pb.ScoresRequest:
    if keys is not None:
        return lp_pb.ScoresRequest(run_id=run_id, select="keys", keys=keys)
    return lp_pb.ScoresRequest(run_id=run_id, select="all" if select_all else "unlabelled")


def check_keys(party_b: str, request: lp_pb.ScoresRequest, tls: TlsConfig | None = None) -> lp_pb.ScoresPlan:
    """B's answer to which rows a request selects (a key outside the run's dataset is refused)."""
    with _channel(party_b, tls) as channel:
        try:
            return lp_grpc.LabelOwnerStub(channel).CheckKeys(request, timeout=60)
        except grpc.RpcError as error:
            raise RunClientError(f"party B at {party_b} refused: {error.code().name}: {error.details()}") from None


def write_scores(party_b: str, request: lp_pb.ScoresRequest, out: Path, tls: TlsConfig | None = None) -> int:
    """B's rows, written to ``out`` (CSV or Parquet by its extension) as they arrive; the row count."""
    if out.suffix.lower() not in SCORE_FORMATS:
        raise RunClientError(f"--out {out}: write .csv or .parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer, classes, rows = None, [], 0
    with _channel(party_b, tls) as channel:
        try:
            for message in lp_grpc.LabelOwnerStub(channel).Scores(request, timeout=3600):
                classes = list(message.classes) or classes
                batch = _batch(message, classes)
                if writer is None:
                    writer = (pq.ParquetWriter(tmp, batch.schema) if out.suffix.lower() != ".csv"
                              else pacsv.CSVWriter(tmp, batch.schema))
                writer.write_batch(batch)
                rows += batch.num_rows
        except grpc.RpcError as error:
            tmp.unlink(missing_ok=True)
            raise RunClientError(f"party B at {party_b} refused: {error.code().name}: {error.details()}") from None
        finally:
            if writer is not None:
                writer.close()
    tmp.replace(out)
    return rows


def _batch(message: lp_pb.ScoreRows, classes: list[str]) -> pa.RecordBatch:
    count = len(message.keys)
    columns = {"key": pa.array(list(message.keys), pa.string()), "predicted": pa.array(list(message.predicted), pa.string())}
    flat = list(message.probabilities)
    for c, name in enumerate(classes):
        columns[f"p_{name}"] = pa.array(flat[c :: len(classes)] if count else [], pa.float32())
    return pa.RecordBatch.from_pydict(columns)
