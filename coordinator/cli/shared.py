"""What every command of the `vesper` command line shares: its consoles, exit codes, choices,
the run options of `train` and `demo`, and how settings are read (errors as one line per problem)."""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from vesper.common.config import (
    ConfigError,
    RunConfig,
    VesperConfig,
    load_config,
    validated,
)
from vesper.common.dotted_settings import set_dotted
from vesper.coordinator.run_client import format_epsilon

# --help in click's plain layout: at 80 columns every description keeps about 50 columns (the rich
# layout left some 15 beside long option names); no rich markup in help texts
PLAIN_HELP = {"rich_markup_mode": None}
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


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as an error, exactly (it may name TOML sections: "[run]" is not markup), and exit."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def check_log_format(value: str) -> None:
    """--log-format of the commands that start services: text or json, else exit 2 naming both."""
    from vesper.common.log_format import LOG_FORMATS

    if value not in LOG_FORMATS:
        fail(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {value!r}")


def load_settings(config: Path | None) -> VesperConfig:
    if config is None:
        return VesperConfig()
    try:
        return load_config(config)
    except ConfigError as exc:
        fail(str(exc))


def parse_epsilon(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        fail(f"--epsilon must be a number or inf, got {text!r}")
    return value


def run_settings(base: VesperConfig, overrides: dict[str, Any]) -> RunConfig:
    data = base.run.model_dump(exclude_unset=True) if base.run else {}
    for dotted, value in overrides.items():
        if value is not None:
            set_dotted(data, dotted, value.value if isinstance(value, Enum) else value)
    try:
        return validated(RunConfig, data, "invalid run settings (the [run] section and the flags)", "run")
    except ConfigError as exc:
        fail(str(exc))


# shared run options of `train` and `demo` -------------------------------------------------------
LogFormatOpt = typer.Option(
    "text", "--log-format", help="The services' logs in WORKDIR/logs: text, or json lines with the run id on each.",
)
DatasetOpt = typer.Option(None, "--dataset", help="Bundled name (cora), a name from the parties' [datasets], or an .npz path.")
ExtractorOpt = typer.Option(
    None, "--extractor",
    help="Party A's extractor, a plugin installed at A (`vesper extractors` lists this machine's): "
    "mlp, pmp-gin, pmp-gcn, gap, vfgnn, dpar-edge, dpar-node, ... Unset: gap, or progap where --edge-bound "
    "declares a mean degree (2 x bound / nodes) of 20 or more.",
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
PredictionPassesOpt = typer.Option(
    None, "--prediction-passes", min=0,
    help="Prediction passes (vesper predict) to reserve in the budget; needed only by extractors whose "
    "evaluation releases are charged (PMP, VFGNN, HeterPoisson); default 0.",
)
EdgeRateOpt = typer.Option(
    None, "--edge-sample-rate",
    help="q: A keeps a secret Poisson sample of its edges at this rate per release, credited under visible-batch.",
)
PathEpochsOpt = typer.Option(
    None, "--edge-free-path-epochs", min=0,
    help="Epochs the edge-free path (the MLP's layers every edge-level release carries) trains alone with B "
    "first, for an extractor released once (gap, relational-gap, progap): default the MLP baseline's epochs minus the "
    "run's, so the path trains as long as the baseline; 0 = none. Free: it reads no edge.",
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


def run_overrides(**kw: Any) -> dict[str, Any]:
    return {
        "dataset": kw["dataset"],
        "extractor.name": kw["extractor"],
        "decoder.kind": kw["decoder"],
        "privacy.epsilon": parse_epsilon(kw["epsilon"]),
        "privacy.accounting": kw["accounting"],
        "privacy.accountant": kw["accountant"],
        "privacy.edge_sample_rate": kw["edge_sample_rate"],
        "privacy.delta": kw["delta"],
        "privacy.edge_bound": kw["edge_bound"],
        "privacy.prediction_passes": kw.get("prediction_passes"),
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
        "extractor.edge_free_path_epochs": kw.get("edge_free_path_epochs"),
        **{f"extractor.params.{key}": value for key, value in parse_params(kw["param"]).items()},
        "label_privacy.mode": kw["label_privacy"],
        "label_privacy.epsilon": parse_epsilon(kw["label_epsilon"]),
        "label_privacy.delta": kw["label_delta"],
        **{f"label_privacy.pate.{key}": value for key, value in parse_params(kw["label_param"]).items()},
        "record_gradients": kw["record_gradients"],
        "audit.canaries": kw.get("canaries"),
        "audit.membership": kw.get("membership_audit"),
        "audit.record_releases": kw.get("record_releases"),
    }


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """``--param KEY=VALUE`` pairs; VALUE is JSON when it parses (numbers, true, lists), else text."""
    parsed: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            fail(f"--param {pair!r}: expected KEY=VALUE with KEY a parameter name")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
    return parsed

def hidden_batch_numbers(events: float | None, bound6: float | None) -> str:
    return (
        f"hidden-batch: ε from dp-accounting events {format_epsilon(events)}, from the paper's "
        f"bound (6) {format_epsilon(bound6)}; charged the larger."
    )
