"""``vesper``: serve the services, train, read budgets, run the demo — the command line as wiring.

One module per command group (``serve``, ``runs``, ``budgets``, ``extractors``, ``certificates``,
``data``, ``serving`` (align, predict); what they share is in ``shared``). The benchmarks (``vesper bench``, in
``vesper.benchmarks``) and the audit (``vesper audit``, in ``vesper.auditor``) are registered
lazily: they are imported only when asked for, so starting a service (``vesper serve``) never
imports them.
"""

from __future__ import annotations

import importlib

import click
import typer
from typer.core import TyperGroup

from vesper.coordinator.cli import budgets, certificates, data, extractors, runs, serve, serving
from vesper.coordinator.cli.shared import PLAIN_HELP, console  # noqa: F401 (console: what tests capture)
from vesper.coordinator.cli.summaries import print_summaries  # noqa: F401 (re-exported)

# name -> (module, attribute): a Typer app or command loaded when the name is asked for
LAZY_COMMANDS = {
    "audit": ("vesper.auditor.cli", "audit_app"),
    "bench": ("vesper.benchmarks.cli", "bench_app"),
}


class LazyGroup(TyperGroup):
    """The top-level group: the commands registered here, and the lazy ones above on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY_COMMANDS:
            return super().get_command(ctx, name)
        module, attribute = LAZY_COMMANDS[name]
        command = typer.main.get_command(getattr(importlib.import_module(module), attribute))
        command.name = name
        return command


app = typer.Typer(
    cls=LazyGroup,
    help="vesper: train a GNN across two institutions with edge-level differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)
app.command()(serve.serve)
app.command()(serve.health)
app.command()(runs.train)
app.command()(budgets.status)
app.add_typer(budgets.ledger_app, name="ledger")
app.command()(runs.demo)
app.command("extractors")(extractors.extractors_command)
app.command()(certificates.certs)
app.add_typer(data.data_app, name="data")
app.command()(serving.align)
app.command()(serving.predict)


def main() -> None:
    try:
        app()
    except SystemExit as exc:
        if serve.service_stopped.is_set() and exc.code in (0, None):
            serve.end_without_teardown()
        raise
