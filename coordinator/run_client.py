"""Drive one run at party A and show its progress live."""

from __future__ import annotations

import math
from collections.abc import Callable

import grpc
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from vesper.common.config import RunConfig, RunSummary, TlsConfig, describe_validation_error
from vesper.common.dotted_settings import is_set
from vesper.common.grpc_server import channel_options
from vesper.common.tls import TlsError, open_channel
from vesper.proto.v1 import graph_party_pb2 as pb
from vesper.proto.v1 import graph_party_pb2_grpc as pb_grpc


class RunClientError(RuntimeError):
    """Party A could not be reached or refused the run; ``exit_code`` is what `vesper train` exits with."""

    exit_code = 1


class PartyALost(RunClientError):
    """Party A vanished during a run that it had started: the run is interrupted, and resumable."""

    exit_code = 4  # as a run summary with status interrupted


# how a vanished server shows on an open stream: the connection went (UNAVAILABLE), or the
# stream was reset under the call (INTERNAL / UNKNOWN "Stream removed", "RST_STREAM")
_TRANSPORT_LOST = ("stream removed", "rst_stream", "socket closed", "connection reset", "failed to connect")


def _party_a_vanished(error: grpc.RpcError) -> bool:
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return True
    details = (error.details() or "").lower()
    return error.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and any(t in details for t in _TRANSPORT_LOST)


def format_epsilon(value: float | None) -> str:
    """ε for display: 4 significant digits, rounded up, never down (exact values are in --json)."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞"
    if value <= 0:
        return "0"
    scale = 10.0 ** (3 - math.floor(math.log10(value)))
    return f"{math.ceil(value * scale) / scale:.4g}"


def drive_run(
    party_a: str, config: RunConfig | None, console: Console, tls: TlsConfig | None = None,
    resume_run_id: str | None = None, on_progress: Callable[[pb.Progress], None] | None = None,
) -> RunSummary:
    """Start ``config`` at party A and follow it to its summary; or, with ``resume_run_id``
    (and no config), continue that interrupted run from A's last checkpoint.

    ``tls``: the coordinator's mutual-TLS settings (``[coordinator].tls``); None = plaintext.
    """
    if resume_run_id:
        request = pb.StartRunRequest(resume_run_id=resume_run_id)
        budget, mode, title = "budget", "", f"resuming {resume_run_id}"
    else:
        # settings cross versions strictly: only those given are sent, and party A applies its own defaults
        request = pb.StartRunRequest(run_config_json=config.model_dump_json(exclude_unset=True))
        budget, mode = format_epsilon(config.privacy.epsilon), config.privacy.accounting
        # a run that names no extractor but declares an edge bound trains the one party A
        # chooses from it (party_a.extractors.default_choice; its progress says which)
        known = is_set(config, "extractor.name") or config.privacy.edge_bound is None
        title = f"{config.extractor.name if known else 'default extractor'} on {config.dataset}"
    run_id = resume_run_id or ""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        # every ε names the accounting that produced it (hidden-batch is a reproduction, no guarantee)
        TextColumn("ε {task.fields[eps]} / {task.fields[budget]} ({task.fields[mode]})"),
        TimeElapsedColumn(),
    )
    try:
        channel = open_channel(party_a, tls, channel_options(16), setting="coordinator.tls")
    except TlsError as exc:
        raise RunClientError(str(exc)) from None
    with channel:
        call = pb_grpc.GraphPartyStub(channel).StartRun(request)
        try:
            with Progress(*columns, console=console, transient=False) as progress:
                task = progress.add_task(title, total=None, loss="-", eps="0", budget=budget, mode=mode or "accounting: ?")
                for event in call:
                    if event.HasField("summary_json"):
                        try:
                            summary = RunSummary.model_validate_json(event.summary_json)
                        except ValidationError as exc:  # a newer party A's summary format
                            problems = describe_validation_error(exc).replace("\n", "; ")
                            raise RunClientError(f"cannot read party A's run summary: {problems}") from None
                        progress.update(task, description=summary.status, eps=format_epsilon(summary.epsilon_spent))
                        return summary
                    p = event.progress
                    run_id = p.run_id or run_id
                    if p.accounting:  # A names the run's mode and budget on every event (a resume learns them here)
                        progress.update(task, mode=p.accounting, budget=format_epsilon(p.epsilon_budget))
                    if on_progress is not None:
                        on_progress(p)
                    if p.phase == "train" and p.total_steps:
                        progress.update(
                            task, total=p.total_steps, completed=p.step, loss=f"{p.loss:.4f}",
                            eps=format_epsilon(p.epsilon_spent), description=f"{p.message or 'epoch'} {p.epoch}/{p.epochs}",
                        )
                    elif p.message:
                        progress.update(task, description=p.message, eps=format_epsilon(p.epsilon_spent))
        except KeyboardInterrupt:
            call.cancel()
            raise
        except grpc.RpcError as error:
            if _party_a_vanished(error):
                if run_id:
                    raise PartyALost(
                        f"lost party A at {party_a} during run {run_id} ({error.details()}); the run is interrupted. "
                        f"Once party A is back: vesper train --resume {run_id}"
                    ) from None
                raise RunClientError(f"cannot reach party A at {party_a}: {error.details()}") from None
            raise RunClientError(f"party A refused the run: {error.code().name}: {error.details()}") from None
    if run_id:
        raise PartyALost(
            f"party A ended run {run_id} without a summary; the run is interrupted. Once party A is back: "
            f"vesper train --resume {run_id}"
        )
    raise RunClientError("party A ended the run without a summary")
