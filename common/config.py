"""Configuration models: one TOML file per institution, validated by pydantic.

A file may hold any of the sections ``[party_a]``, ``[party_b]``, ``[accountant]``,
``[coordinator]`` and ``[run]``; each command reads the sections it needs and says so
when one is missing. Command-line flags override ``[run]`` values.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vesper.common.privacy.names import AccountantName
from vesper.common.versioning import Report

DecoderName = Literal["concat", "gru"]
AccountingMode = Literal["visible-batch", "hidden-batch"]
WireDTypeName = Literal["float32", "bfloat16"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


_M = TypeVar("_M", bound=BaseModel)


class ExtractorConfig(_Model):
    """Party A's encoder and private representation extractor (PRE)."""

    name: str = Field(
        "gap",
        pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$",
        description="an extractor `vesper extractors` lists; unnamed: gap, or progap if edge_bound gives degree >= 20",
    )
    layers: int = Field(1, ge=1, le=8, description="L, message-passing layers")
    fanout: int = Field(
        10, ge=0, description="D, neighbours sampled per node and layer; 0 = all neighbours"
    )
    d_min: int = Field(
        1, ge=0, description="D_min of truncated PMP-GCN: nodes with fewer neighbours get no messages"
    )
    dim: int = Field(64, ge=1, le=4096, description="d, width of every released embedding")
    encoder_hidden: int = Field(128, ge=1, le=16384)
    dropout: float = Field(0.8, ge=0.0, lt=1.0, description="encoder dropout")
    spectral_norm: bool = Field(True, description="spectral normalisation of PMP layer weights")
    noise_multiplier: float | None = Field(
        None,
        gt=0,
        description="fixed z = noise std / sensitivity instead of calibrating it to epsilon",
    )
    degree_bound: int = Field(
        0,
        ge=0,
        description="D of the stable degree projection A applies to its graph before reading it; "
        "0 = none (needed for a participation bound with layers >= 2)",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the extractor's own hyper-parameters, validated by party A against its plugin",
    )
    edge_free_path: bool = Field(True, description=(
        "an edge-level extractor's releases also carry the MLP extractor's edge-free layers, trained end to end with "
        "B, and B keeps the edge-free head unless another of its three (the extractor's layers, or all) leads it on "
        "validation by more than the paired noise: a graph extractor then never does worse than not reading the "
        "graph (docs/privacy.md, section 2.5). Free under edge-level DP; false = the extractor's own layers only"))
    edge_free_path_epochs: int | None = Field(None, ge=0, le=100_000, description=(
        "epochs the edge-free path trains alone with B first, in a stage of its own, for an extractor released "
        "once (one-shot), so it trains as long as the MLP baseline though the run stops early (GAP: 20 epochs). "
        "None = the baseline's epochs minus the run's; 0 = no stage (docs/privacy.md, section 2.5)"))
    edge_free_path_layers: int | None = Field(None, ge=1, le=8, description=(
        "L_f, the edge-free path's layers; None = the run's (where the extractor's defaults set them: the MLP's)"))
    edge_free_path_dim: int | None = Field(None, ge=1, le=4096, description=(
        "the edge-free path's width, a multiple of dim, sent as slices of dim; None = dim (where the extractor's "
        "defaults set dim: the MLP's, so the path is the mlp run of the same settings, docs/privacy.md 2.5)"))


class DecoderConfig(_Model):
    """Party B's decoder."""

    kind: DecoderName = "concat"
    hidden_dim: int = Field(64, ge=1, le=16384)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class OptimizerConfig(_Model):
    """Optimiser used by both parties for their own parameters."""

    name: Literal["adam", "sgd"] = "adam"
    lr: float = Field(0.01, gt=0, le=10)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)


# δ is public: declared, never computed from A's graph (docs/privacy.md, section 1). At 1e-6 the
# usual rule δ < 1/|E| holds for graphs of up to a million edges; declare a smaller δ for larger ones.
DEFAULT_DELTA = 1e-6


class PrivacyConfig(_Model):
    epsilon: float = Field(8.0, description="edge-level budget; inf = no noise and no budget")
    delta: float = Field(
        DEFAULT_DELTA,
        description="δ, public: declared by A's operator, never computed from A's graph (an exact |E| would "
        "decide an edge). The default 1e-6 is below 1/|E| for graphs of up to a million edges; declare a "
        "smaller δ for larger graphs",
    )
    edge_bound: int | None = Field(
        None, ge=1,
        description="a public upper bound on the number of A's undirected edges, declared by A's operator; "
        "rates that need |E| use it (relational pre-training: q = expected_batch / edge_bound), never the "
        "exact count",
    )
    accounting: AccountingMode = Field(
        "visible-batch",
        description="visible-batch (B sees each batch; the default) or hidden-batch (the paper's "
        "Theorem 2.1, which assumes B cannot tell which edges a step used: reproduction only)",
    )
    accountant: AccountantName = Field("pld", description="pld (tighter) or rdp")
    edge_sample_rate: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="q: per release, A keeps a secret Poisson sample of its edges at this rate "
        "and is credited for it (visible-batch); unset = every edge",
    )
    prediction_passes: int = Field(
        0, ge=0, le=100,
        description="prediction passes reserved in the budget (vesper predict; docs/privacy.md, section 2.4): each "
        "releases every node of the dataset once, charged like the evaluation pass, and the noise is calibrated "
        "for them up front; free (and needing none) for extractors whose evaluation releases cost nothing",
    )

    @field_validator("epsilon")
    @classmethod
    def _positive_epsilon(cls, value: float) -> float:
        if math.isnan(value) or value <= 0:
            raise ValueError("epsilon must be > 0 (or inf for a non-private run)")
        return value

    @field_validator("delta", mode="before")
    @classmethod
    def _declared_delta(cls, value: object) -> object:
        # records written before δ became a declared setting hold null (then: 1/|E|, now refused as a rule)
        return DEFAULT_DELTA if value is None else value

    @field_validator("delta")
    @classmethod
    def _delta_range(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError("delta must be in (0, 1)")
        return value


LabelPrivacyMode = Literal["none", "rr", "pate"]


class PateConfig(_Model):
    """DP-GPL's teacher ensemble at party B (docs/label-privacy.md)."""

    teachers: int = Field(100, ge=2, le=100_000, description="N: disjoint groups of B's labelled nodes, one teacher each")
    queries: int = Field(300, ge=1, le=1_000_000, description="Q: query nodes, drawn from B's validation split, the teachers label")
    aggregator: Literal["confident-gnmax", "gnmax"] = Field(
        "confident-gnmax",
        description="confident-gnmax (threshold step, then GNMax on the confident queries) or gnmax (every "
        "query answered; no threshold step to pay for, which measured as good or better: docs/label-privacy.md)",
    )
    threshold: float | None = Field(
        None, ge=0, description="T of Confident-GNMax, in votes; default N·(1/C + 0.2·(1 − 1/C)), 0.6·N for two classes"
    )
    sigma1: float | None = Field(None, gt=0, description="σ1, noise std of the threshold step; unset: calibrated")
    sigma2: float | None = Field(None, gt=0, description="σ2, noise std of the GNMax step; unset: calibrated")
    teacher_epochs: int = Field(100, ge=1, le=100_000, description="full-batch epochs of each teacher")
    teacher_lr: float = Field(0.05, gt=0, le=10)
    teacher_weight_decay: float = Field(1e-2, ge=0, allow_inf_nan=False)
    teacher_class_balanced: bool = Field(True, description="weight each teacher's loss by inverse class frequency in its group")

    @model_validator(mode="after")
    def _consistent(self) -> PateConfig:
        if self.aggregator == "gnmax":
            if self.sigma1 is not None or self.threshold is not None:
                raise ValueError("label_privacy.pate: aggregator gnmax has no threshold step; unset sigma1 and threshold")
        elif (self.sigma1 is None) != (self.sigma2 is None):
            raise ValueError("label_privacy.pate: give both sigma1 and sigma2, or neither (calibrated together)")
        if self.threshold is not None and self.threshold > self.teachers:
            raise ValueError(
                f"label_privacy.pate.threshold={self.threshold:g} exceeds the {self.teachers} teachers' votes: "
                "no query could ever be answered"
            )
        return self


class LabelPrivacyConfig(_Model):
    """Protection of party B's labels against party A; B keeps its own ledger for it."""

    mode: LabelPrivacyMode = Field(
        "none", description="none, rr (randomised response, once) or pate (DP-GPL's teacher ensemble)"
    )
    epsilon: float = Field(math.inf, description="B's label budget; inf only with mode none")
    delta: float | None = Field(None, description="default min(1e-5, 1/(B's labelled training nodes))")
    accountant: AccountantName = Field("pld", description="accountant of B's label ledger: pld or rdp")
    pate: PateConfig = PateConfig()

    @field_validator("epsilon")
    @classmethod
    def _positive_epsilon(cls, value: float) -> float:
        if math.isnan(value) or value <= 0:
            raise ValueError("label_privacy.epsilon must be > 0")
        return value

    @field_validator("delta")
    @classmethod
    def _delta_range(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value < 1:
            raise ValueError("label_privacy.delta must be in (0, 1)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LabelPrivacyConfig:
        if self.mode == "none" and not math.isinf(self.epsilon):
            raise ValueError(
                f"label_privacy.epsilon={self.epsilon:g} is set but label_privacy.mode is none: "
                "choose rr or pate, or leave the label budget unset"
            )
        if self.mode != "none" and math.isinf(self.epsilon):
            raise ValueError(f"label_privacy.mode={self.mode} needs a finite label_privacy.epsilon")
        return self


class AuditConfig(_Model):
    """An audited run (docs/audit.md): what A plants and what B keeps for the attacks.

    None of it changes what is charged: canary edges are edges of A's graph like any
    other, and the membership setting only changes which graph A reads when.
    """

    canaries: int = Field(
        0, ge=0, le=1_000_000,
        description="m: candidate canary edges (pairs of unlinked nodes) A draws; each is inserted into "
        "A's graph with probability 1/2, secretly (0 = no canary audit)",
    )
    canary_seed: int = Field(0, ge=0, description="seed of the m candidate pairs (public to the auditor)")
    membership: bool = Field(
        False,
        description="TFTS (VESPER App. C.7): A trains on the subgraph induced by B's training nodes and "
        "evaluates on the full graph; the evaluation pass also releases the training nodes",
    )
    record_releases: bool = Field(
        False,
        description="party B keeps what it received (per-node sums of the released embeddings, and the "
        "decoder's posteriors) in runs/<id>/received.npz, for the attacks",
    )


class RunConfig(_Model):
    """One training run, sent by the coordinator to party A."""

    dataset: str = Field("cora", description="bundled name, a name from the parties' [datasets], or an .npz path")
    epochs: int = Field(50, ge=1, le=100_000)
    batch_size: int = Field(256, ge=1, le=1_000_000)
    seed: int = Field(0, ge=0, description="root order and parameter initialisation (not A's noise)")
    split_seed: int = Field(0, ge=0, description="seed of B's stratified split when the data has none")
    wire_dtype: WireDTypeName = "float32"
    eval_chunk: int = Field(4096, ge=1, description="evaluation nodes per message")
    privacy: PrivacyConfig = PrivacyConfig()
    extractor: ExtractorConfig = ExtractorConfig()
    decoder: DecoderConfig = DecoderConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    label_privacy: LabelPrivacyConfig = LabelPrivacyConfig()
    record_gradients: bool = Field(
        False,
        description="party A keeps the gradients B sends in the last epoch (runs/<id>/gradients.npz), "
        "for the label-leakage measurement",
    )
    audit: AuditConfig = AuditConfig()

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        ex = self.extractor
        if ex.name == "pmp-gcn" and ex.fanout and ex.d_min > ex.fanout:
            raise ValueError(
                f"extractor.d_min={ex.d_min} exceeds extractor.fanout={ex.fanout}: with at most "
                "D sampled neighbours no node could reach D_min, so every message would be blocked"
            )
        if ex.degree_bound and ex.fanout and ex.fanout < ex.degree_bound:
            raise ValueError(
                f"extractor.fanout={ex.fanout} is below extractor.degree_bound={ex.degree_bound}: with a "
                "degree projection the extractor reads every kept neighbour; set fanout to 0"
            )
        if ex.name == "pmp-gcn" and ex.degree_bound and ex.d_min > ex.degree_bound:
            raise ValueError(
                f"extractor.d_min={ex.d_min} exceeds extractor.degree_bound={ex.degree_bound}: no node "
                "could reach D_min, so every message would be blocked"
            )
        if self.privacy.edge_sample_rate is not None and ex.degree_bound:
            raise ValueError(
                "privacy.edge_sample_rate cannot be combined with extractor.degree_bound: through the "
                "projection one edge can change three, and the Poisson credit covers one"
            )
        if self.privacy.accounting == "hidden-batch":
            if self.privacy.edge_sample_rate is not None:
                raise ValueError(
                    "privacy.edge_sample_rate is a visible-batch credit; hidden-batch already assumes "
                    "the paper's sampling amplification: choose one"
                )
            if ex.name != "mlp" and not ex.fanout and not ex.degree_bound:
                raise ValueError(
                    "hidden-batch needs the degree bound D of VESPER Theorem 2.1: set extractor.fanout "
                    "or extractor.degree_bound"
                )
        if math.isinf(self.privacy.epsilon) and ex.noise_multiplier is not None:
            raise ValueError(
                "extractor.noise_multiplier is set but privacy.epsilon is inf (no noise): "
                "choose one"
            )
        return self


# host:port: a host name or an IP address (IPv6 in brackets), and a port (0 = any free port)
LISTEN = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
METRICS_LISTEN = (
    "host:port where this service serves its Prometheus metrics at /metrics (port 0 = any free port, "
    "written to --ready-file as metrics_port); unset = no metrics (docs/deployment.md, \"Metrics and logs\")"
)


def check_metrics_listen(value: str, setting: str = "") -> str:
    """``value`` if it is ``host:port``, else a ValueError with the fix (naming ``setting`` if
    given; a validator's error is named by its location)."""
    match = LISTEN.fullmatch(value)
    if match is None or int(match["port"]) > 65535:
        raise ValueError(
            f"{setting + ' ' if setting else ''}must be host:port, e.g. 127.0.0.1:9464 or [::1]:9464 (port 0 = any "
            f"free port; leave it unset for no metrics){f', got {value!r}' if setting else ''}"
        )
    return value


def _metrics_listen(value: str | None) -> str | None:
    return None if value is None else check_metrics_listen(value)


# the settings every service section has alike: one declaration each
MetricsListen = Annotated[str | None, AfterValidator(_metrics_listen), Field(description=METRICS_LISTEN)]
AlignmentPadTo = Annotated[int | None, Field(
    ge=1, le=1 << 31,
    description="how many blinded keys this party sends in an alignment (docs/alignment.md): at least its key count; unset = the next power of two, so the other party learns the count only to within a factor of two",
)]


# services sharing a few cores each with torch's default (one thread per core) spin against
# each other: an epoch on a 1M-node graph was many times slower so on 2 cores than with 1 thread
# each (docs/performance-notes.md)
TORCH_THREADS = (
    "torch intra-op threads of this service, set when it starts (`vesper serve`); unset = torch's "
    "default, one per core. Set it when services share cores"
)


class TlsConfig(_Model):
    """Mutual TLS for one service: its own certificate and key, and the CA that signed every
    party's certificate (``vesper certs`` makes all of them). A peer without a certificate
    from this CA is refused."""

    ca_file: Path = Field(description="PEM certificate of the deployment's CA")
    cert_file: Path = Field(description="PEM certificate of this service, signed by the CA")
    key_file: Path = Field(description="PEM private key of this service (keep it 0600)")


class PartyAConfig(_Model):
    listen: str = "127.0.0.1:50051"
    label_party: str = Field("127.0.0.1:50052", description="party B's gRPC address")
    accountant: str = Field("127.0.0.1:50053", description="the accountant's gRPC address")
    accountant_status_url: str = Field(
        "http://127.0.0.1:8080", description="the accountant's REST base URL, shown to users"
    )
    accountant_token_file: Path | None = Field(
        None, description="copy of the accountant's charge token file; needed to create and charge runs"
    )
    device: str = Field("cpu", description="torch device for A's hot path: cpu, cuda, cuda:1")
    workdir: Path = Path(".vesper/party_a")
    datasets: dict[str, str] = Field(default_factory=dict, description="dataset name -> .npz path")
    secret_seed: int | None = Field(
        None,
        description="seed of A's noise and neighbour sampling; unset = fresh OS randomness. "
        "Tests only: B must never learn it.",
    )
    max_message_mb: int = Field(64, ge=1, le=2047)
    step_timeout_s: float = Field(120.0, gt=0)
    checkpoint_every: int = Field(
        100, ge=1, description="training steps between checkpoints of A and B (and one at the end of training)"
    )
    peer_retry_s: float = Field(
        60.0, ge=0, description="how long A retries the accountant on transient errors, with backoff, before the run is interrupted"
    )
    tls: TlsConfig | None = Field(None, description="mutual TLS to party B, the accountant and the coordinator; unset = plaintext (loopback only)")
    pipeline: bool = Field(
        True, description="sample step t+1 while B computes step t; exact: the same releases either way"
    )
    lease_s: float = Field(
        15.0, ge=1.0, le=3600.0,
        description="a run has one trainer: the accountant keeps the trainer's lease this long between renewals "
        "(every third of it); a resume of a run whose trainer was killed waits at most this long",
    )
    torch_threads: int | None = Field(None, ge=1, description=TORCH_THREADS)
    alignment_pad_to: AlignmentPadTo = None
    metrics_listen: MetricsListen = None
    workers: int = Field(
        1, ge=1, le=1024,
        description="W processes share each release's roots (torch.distributed, party_a.workers): the same "
        "releases and ledger as 1; per-step extractors (mlp, pmp-gin, pmp-gcn) and GAP's hops (gap, relational-gap) "
        "only; 1 = no process group",
    )
    workers_listen: str | None = Field(
        None, pattern=r"^[^\s:]+:\d{1,5}$",
        description="host:port where rank 0 waits for W-1 workers started by hand on other hosts "
        "(python -m vesper.party_a.workers --forever); unset: party A starts them on this host",
    )


# a decoder has one output row per class: a bound keeps a stray label value from asking for terabytes
DEFAULT_MAX_CLASSES = 1000


class PartyBConfig(_Model):
    listen: str = "127.0.0.1:50052"
    device: str = "cpu"
    workdir: Path = Path(".vesper/party_b")
    datasets: dict[str, str] = Field(default_factory=dict)
    receipt_log: Path | None = Field(
        None, description="JSONL file where B records every release it receives, before using it"
    )
    max_message_mb: int = Field(64, ge=1, le=2047)
    accountant: str | None = Field(
        None, description="the accountant's gRPC address, for B's own label ledger (needed for label privacy)"
    )
    accountant_status_url: str = Field("http://127.0.0.1:8080", description="the accountant's REST base URL")
    accountant_token_file: Path | None = Field(
        None, description="copy of the accountant's label charge token file; B's credential for its label ledger"
    )
    require_label_privacy: bool = Field(
        False, description="refuse runs whose label_privacy.mode is none"
    )
    max_label_epsilon: float | None = Field(
        None, gt=0,
        description="refuse runs whose label budget exceeds this: B, not the run's requester, bounds its own ε",
    )
    secret_seed: int | None = Field(
        None,
        description="seed of B's label-privacy randomness; unset = fresh OS randomness. Tests only: A must never learn it.",
    )
    tls: TlsConfig | None = Field(None, description="mutual TLS to party A and the accountant; unset = plaintext (loopback only)")
    torch_threads: int | None = Field(None, ge=1, description=TORCH_THREADS)
    max_classes: int = Field(
        DEFAULT_MAX_CLASSES, ge=2, le=1_000_000,
        description="the most classes B's labels may have: a label outside 0..max_classes-1 is refused when the data is loaded",
    )
    alignment_pad_to: AlignmentPadTo = None
    metrics_listen: MetricsListen = None


class AccountantConfig(_Model):
    listen: str = "127.0.0.1:50053"
    rest_listen: str = "127.0.0.1:8080"
    ledger: Path = Path(".vesper/accountant/ledger.sqlite")
    charge_token_file: Path = Field(
        Path(".vesper/accountant/charge.token"),
        description="party A's credential for creating runs and charging; created (0600) if missing",
    )
    label_charge_token_file: Path = Field(
        Path(".vesper/accountant/label-charge.token"),
        description="party B's credential for its label ledgers (privacy unit label); created (0600) if missing",
    )
    tls: TlsConfig | None = Field(None, description="mutual TLS on gRPC, server TLS on REST; unset = plaintext (loopback only)")
    metrics_listen: MetricsListen = None


class CoordinatorConfig(_Model):
    party_a: str = "127.0.0.1:50051"
    party_b: str = Field("127.0.0.1:50052", description="party B's gRPC address, for the scores of vesper predict")
    accountant_status_url: str = "http://127.0.0.1:8080"
    tls: TlsConfig | None = Field(None, description="mutual TLS to party A; the CA also verifies the accountant's REST")


class VesperConfig(_Model):
    party_a: PartyAConfig | None = None
    party_b: PartyBConfig | None = None
    accountant: AccountantConfig | None = None
    coordinator: CoordinatorConfig | None = None
    run: RunConfig | None = None


class ConfigError(ValueError):
    """Settings that cannot be used; one line per problem, naming the setting, what is wrong and
    the value given (never a raw validation dump)."""


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """``exc`` as one line per problem: ``prefix.dotted.setting: message (got VALUE)``."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in (prefix, *error["loc"]) if part != "")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "not a setting here (check its spelling and its section)"
        given = error.get("input")
        shown = "" if error["type"] in ("missing", "extra_forbidden") or isinstance(given, dict) else f" (got {given!r:.60})"
        lines.append(f"{where or 'settings'}: {message}{shown}")
    return "\n".join(lines)


def validated(model: type[_M], data: Any, what: str, prefix: str = "") -> _M:
    """``model.model_validate(data)``, or a ConfigError that starts with ``what`` and lists every problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{what}:\n{describe_validation_error(exc, prefix)}") from None


def load_config(path: Path) -> VesperConfig:
    """Read and validate a TOML config file (ConfigError, a ValueError, on any problem)."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return validated(VesperConfig, raw, f"config file {path} has settings vesper cannot use")


class Metric(_Model):
    name: str
    value: float


class RunSummary(Report):
    """What a finished run reports; ``vesper train --json-out`` writes exactly this.

    A report (common.versioning): it crosses versions (party A upgraded before its coordinator),
    so fields this version does not know are dropped, and a newer ``format`` is refused clearly;
    settings (the other models) stay strict.
    """

    run_id: str
    # interrupted: a peer was lost mid-run; `vesper train --resume RUN` continues it
    status: Literal["completed", "refused", "failed", "cancelled", "interrupted"]
    message: str = ""
    dataset: str
    extractor: str
    decoder: str
    accounting: str
    privacy_unit: str = Field("edge", description="what one DP neighbour differs in: edge or node")
    epsilon_budget: float
    epsilon_spent: float
    delta: float
    accountant: str = Field("", description="what produced epsilon_spent")
    accountant_requested: str = ""
    assumption: str = ""
    epsilon_events: float | None = Field(None, description="hidden-batch: dp-accounting's ε of the events")
    epsilon_bound6: float | None = Field(None, description="hidden-batch: VESPER bound (6) with Lemma 2")
    test_metric: Metric | None = None
    val_metric: Metric | None = None
    decoder_head: str = Field("", description="with an edge-free path: the head B kept, graph, edge-free or combined")
    head_metrics: dict[str, Metric] = Field(
        default_factory=dict, description="with an edge-free path: each head's metrics, keyed '<split>@<head>'",
    )
    head_errors: dict[str, Metric] = Field(default_factory=dict, description=(
        "with an edge-free path: SE of 'val@<head>' minus the edge-free head's, paired over B's validation nodes"))
    steps: int = 0
    seconds: float = 0.0
    noise_multiplier: float | None = None
    noise_std: float | None = None
    sensitivity: float | None = Field(None, description="of each counted release")
    sensitivity_form: str = Field("", description="per-pass or per-step (docs/privacy.md, section 4.3)")
    participation_bound: int | None = Field(None, description="counted releases per pass; null = every release")
    cost_model: str = Field("", description="the extractor's: none, per-step, one-shot, one-shot + per-step")
    one_shot_releases: int = Field(0, description="releases charged once before training (GAP's hops, DPAR's neighbourhoods)")
    pre_train_releases: int = Field(0, description="charges of A's private pre-training (each covers a chunk of steps)")
    relation: str = Field("", description="the neighbouring relation the guarantee is stated for")
    label_privacy: str = Field("none", description="how B protected its labels: none, rr or pate")
    label_run_id: str = Field("", description="B's label ledger at the accountant (a run of its own)")
    label_epsilon_budget: float | None = None
    label_epsilon_spent: float | None = Field(None, description="ε of B's label ledger, privacy unit: one label")
    label_delta: float | None = None
    label_note: str = Field("", description="what B's label mechanism did, e.g. queries answered")
    split: str = ""
    status_url: str = ""
    baseline: RunSummary | None = None
