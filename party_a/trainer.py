"""Party A's side of one run: VESPER's Algorithm 3 with write-ahead charging, for any extractor.

    set-up   A builds the run's extractor (a plugin, party_a.extractors.registry);
             B tells A the split; the extractor states each kind of release's DpEvent as
             a function of z; the accountant calibrates z
    prepare  the extractor's stages before training: edge-free pre-training with B,
             one-shot releases (GAP's hops, DPAR's neighbourhoods), each charged first
    train    per step: the extractor releases the batch's B x d x L', A charges it, sends
             it to B, receives dLoss/dH and updates what the extractor trains; while B
             computes, A samples the next step's subgraph (pipelining: sampling reads no
             parameter, so the releases are the same; ``pipeline = false`` in [party_a] turns it off)
    evaluate per chunk of validation/test nodes: release, charge, send; B returns metrics

Nothing leaves A before the accountant has committed its charge, and a refused
charge ends the run cleanly without sending. The run's plan (one-shot releases,
stages, epochs x steps, one evaluation sweep) is exactly what is charged, so a
calibrated run ends with ε spent = the calibrated ε ≤ budget.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dp_accounting as dpa
import torch
from torch import nn

from vesper.common.accountant_client import nodes_digest
from vesper.common.config import Metric, PartyAConfig, RunConfig, RunSummary
from vesper.common.dataset_files import load_csr_part, load_graph_part
from vesper.common.optim import build_optimizer
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, PlanRule
from vesper.common.secret_randomness import secret_base
from vesper.common.wire import (
    WireError,
    decode_tensor,
    dtype_to_proto,
    encode_tensor,
    node_mask,
    validate_node_ids,
)
from vesper.party_a.canaries import CanaryDraw, canary_generator, draw_canaries, draw_coins, plant
from vesper.party_a.canary_statistics import STATISTICS_FILE, CanaryStatistics, observe_releases, unsupported_reason
from vesper.party_a.extractors.base import (
    ChargePlan,
    Extractor,
    ExtractorSetup,
    RootPlan,
    Stage,
    default_relation,
    overrides_root_batches,
    shuffled_batches,
)
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.gradient_record import GradientRecord
from vesper.party_a.graph_store import Graph, build_graph, induced_subgraph
from vesper.party_a.membership_audit import check_tfts, same_charges, tfts_chunk
from vesper.party_a.peers import (
    AccountantClient,
    BudgetRefused,
    EvaluationStream,
    LabelPartyClient,
    LeaseRefused,
    PeerError,
    PeerLost,
)
from vesper.party_a.run_checkpoint import Checkpoint, Position, ReleaseJournal, ResumeError, RunFiles
from vesper.party_a.run_lease import LeaseKeeper
from vesper.party_a.step_timings import _NO_TIMER, STEP_TIMINGS_FILE, StepTimings
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import label_party_pb2 as lp_pb
from vesper.proto.v1 import tensor_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphData:
    """What party A loads once per dataset: its graph and its node features."""

    graph: Graph
    features: torch.Tensor

    @classmethod
    def load(cls, path: Path, device: torch.device, *, memory_map: bool = True) -> GraphData:
        """The CSR and features of ``path``, built once per file into a cache (beside it, or in the
        user's cache directory) and memory-mapped (common.dataset_files.load_csr_part): on CPU the
        tensors are views of the mapped files,
        read from disk as the sampler touches them; on CUDA they are copied to the device once,
        here. ``memory_map=False`` builds the graph in memory from the file's edges, as before
        the cache (the same Graph, bit for bit: tests/test_perf_scale.py)."""
        if not memory_map:
            part = load_graph_part(path)
            graph = build_graph(part.edges, part.num_nodes).to(device)
            return cls(graph, torch.from_numpy(part.features).to(device))
        csr = load_csr_part(path)
        graph = Graph(torch.from_numpy(csr.indptr), torch.from_numpy(csr.indices), csr.num_nodes).to(device)
        return cls(graph, torch.from_numpy(csr.features).to(device))


@dataclass(frozen=True)
class ProgressEvent:
    phase: str
    epoch: int = 0
    epochs: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float = math.nan
    epsilon_spent: float = 0.0
    message: str = ""


class Cancelled(RuntimeError):
    """The coordinator went away; the run stops after the current step."""


@dataclass(frozen=True)
class Release:
    """How each kind of release is charged, fixed for the run."""

    rules: list[ChargeRule]
    noise_multiplier: float | None
    sensitivity: float
    participation_bound: int | None
    details: dict

    @property
    def noise_std(self) -> float:
        return 0.0 if self.noise_multiplier is None else self.noise_multiplier * self.sensitivity

    def event_json(self, kind: str) -> str:
        for rule in self.rules:
            if rule.kind == kind:
                return rule.release_event
        raise ValueError(f"the extractor declared no charge rule for {kind} releases")


def _fixed_rules(plan_rules: list[PlanRule], event_of: Callable[[PlanRule], dpa.DpEvent]) -> list[ChargeRule]:
    return [
        ChargeRule(kind=r.kind, release_event=event_to_json(event_of(r)), participation_bound=r.participation_bound)
        for r in plan_rules
    ]


def _relation(extractor: Extractor) -> str:
    return extractor.spec.relation or default_relation(extractor.spec.privacy_unit)


Batches = Callable[[torch.Tensor, int, torch.Generator], list[torch.Tensor]]


def _secret_generators(settings: PartyAConfig, run_seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """Generators for neighbour sampling and noise, never derived from anything B knows."""
    base = secret_base(settings.secret_seed, run_seed)
    sampling = torch.Generator().manual_seed(base)
    noise = torch.Generator(device=device).manual_seed(base ^ 0x5DEECE66D)
    return sampling, noise


@dataclass(frozen=True)
class _PlannedStep:
    """One training step's place: its epoch, its roots and where they stand in the epoch."""

    epoch: int
    position: int  # index into ``epoch_batches``
    batch: torch.Tensor
    epoch_batches: list[torch.Tensor]
    drawn: torch.Tensor  # the root-order generator's state once this epoch's batches were drawn
    index: int  # the release's index in its pass
    last: bool  # the epoch's last non-empty batch


@dataclass(frozen=True)
class _PendingCharge:
    key: str
    future: Future[acc_pb.ChargeReceipt]


_NOT_DRAWN = object()  # the step after the current one has not been looked at yet


def _planned_steps(
    train_ids: torch.Tensor, batch_size: int, epochs: int, batches: Batches, root_order: torch.Generator,
    start: Position | None,
) -> Iterator[_PlannedStep]:
    """Every training step in order, from ``start`` if given. Lazily: an epoch's batches are
    drawn from ``root_order`` (which nothing else reads) when its first step is looked at."""
    first_epoch = start.epoch if start is not None else 0
    for epoch in range(first_epoch, epochs):
        if start is not None and epoch == start.epoch:
            epoch_batches, first = start.batches, start.batch
        else:
            epoch_batches, first = batches(train_ids, batch_size, root_order), 0
        drawn = root_order.get_state()
        last = max((i for i, b in enumerate(epoch_batches) if b.numel()), default=-1)
        index = sum(1 for b in epoch_batches[:first] if b.numel())  # the release's index in its pass
        for position in range(first, len(epoch_batches)):
            batch = epoch_batches[position]
            if batch.numel() == 0:
                continue
            yield _PlannedStep(epoch, position, batch, epoch_batches, drawn, index, position == last)
            index += 1


class _Preparation:
    """The PrepareSession an extractor's ``prepare`` gets: charging and training with B."""

    def __init__(self, run: GraphPartyRun, roots: RootPlan, release: Release) -> None:
        self.run = run
        self.roots = roots
        self.release = release

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self.run.charge(node_ids, self.release, "one-shot-0", "one-shot", index)

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        self.run.charge(node_ids, self.release, "pre-train-0", "pre-train", index)

    def train_stage(
        self, stage: Stage, release: Callable[[torch.Tensor], torch.Tensor], parameters: Iterable[nn.Parameter]
    ) -> None:
        self.run.train_stage(self.roots, self.release, stage, release, list(parameters))

    def progress(self, message: str) -> None:
        self.run.report(ProgressEvent("prepare", message=message, epsilon_spent=self.run.epsilon_spent))


class GraphPartyRun:
    def __init__(
        self,
        config: RunConfig,
        settings: PartyAConfig,
        data: GraphData,
        label_party: LabelPartyClient,
        accountant: AccountantClient,
        report: Callable[[ProgressEvent], None] = lambda event: None,
        cancelled: Callable[[], bool] = lambda: False,
        resume: dict | None = None,
    ) -> None:
        """``resume``: the run's resume record (party_a.run_checkpoint), to continue it."""
        self.config = config
        self.settings = settings
        self.data = data
        self.device = data.features.device
        self.label_party = label_party
        self.accountant = accountant
        self.report = report
        self.cancelled = cancelled
        self.resume = resume
        self.run_id = resume["run_id"] if resume else uuid.uuid4().hex[:12]
        # this trainer's lease: every spending call at the accountant carries it (party_a.run_lease)
        self.accountant.hold(uuid.uuid4().hex, settings.lease_s)
        # canaries: the coins now, the pairs once B has named its split (_plant_canaries)
        self.canary_coins = (
            draw_coins(config.audit.canaries, canary_generator(settings.secret_seed, config.seed))
            if config.audit.canaries else None
        )
        self.canaries: CanaryDraw | None = None
        self.canary_statistics: CanaryStatistics | None = None
        # δ is public, declared with the run: never a statistic of A's graph (docs/privacy.md, section 1)
        self.delta = config.privacy.delta
        self.epsilon_spent = 0.0
        self.steps_done = 0
        self.status_url = f"{settings.accountant_status_url.rstrip('/')}/v1/runs/{self.run_id}"
        self.sampling_generator, self.noise_generator = _secret_generators(settings, config.seed, self.device)
        if resume:
            self.delta = resume["delta"]
            self.sampling_generator.set_state(resume["sampling"])
            self.noise_generator.set_state(resume["noise"])
        # as they stand before anything is drawn: a resumed run replays from here
        self.initial_generators = (self.sampling_generator.get_state(), self.noise_generator.get_state())
        self.gradients: GradientRecord | None = None
        self.label_ledger_id = ""
        self.files = RunFiles(self._run_dir())
        self.journal: ReleaseJournal = self.files.journal()
        self.charges = 0  # ledger rows of this run so far
        self.checkpoint: Checkpoint | None = self.files.latest_checkpoint() if resume else None
        self.step_timings = StepTimings()  # the main session's, saved as runs/<id>/step_timings.json

    # -- the run -------------------------------------------------------------------------------
    def execute(self) -> RunSummary:
        started = time.monotonic()
        cfg = self.config
        summary = RunSummary(
            run_id=self.run_id, status="failed", dataset=cfg.dataset, extractor=cfg.extractor.name,
            decoder=cfg.decoder.kind, accounting=cfg.privacy.accounting, epsilon_budget=cfg.privacy.epsilon,
            epsilon_spent=0.0, delta=self.delta, status_url=self.status_url,
            label_privacy=cfg.label_privacy.mode,
        )
        b_ready = run_created = lost_accountant = lost_lease = refused_lease = False
        extractor: Extractor | None = None
        keeper: LeaseKeeper | None = None
        resuming = self.resume is not None
        try:
            extractor = self._build_extractor()
            if cfg.audit.membership:
                check_tfts(cfg, extractor)
            summary = summary.model_copy(update={
                "delta": self.delta, "privacy_unit": extractor.spec.privacy_unit,
                "cost_model": extractor.spec.cost_model, "relation": _relation(extractor),
            })
            # a run has one trainer (accountant/leases.py): its lease first, before party B hears of the run
            try:
                if resuming:
                    self._reopen_run()
                else:
                    self.accountant.announce_run(self.run_id)
            except LeaseRefused:
                refused_lease = True
                raise
            run_created = resuming
            keeper = LeaseKeeper(self.accountant, self.run_id, self.settings.lease_s).start()
            resume_step = self.checkpoint.position.step if self.checkpoint else 0
            reply = self._setup_label_party(self.run_id, extractor.output_layers, resume_step)
            b_ready = True
            summary = self._with_labels(summary, reply)
            roots = self._plan(reply)
            if self.canary_coins is not None:
                self._plant_canaries(roots)
                extractor = self._build_extractor()  # on the planted graph
            evaluator = extractor
            if cfg.audit.membership:
                # TFTS: training reads only the subgraph of B's training nodes
                extractor = self._build_extractor(induced_subgraph(self.data.graph, roots.train_ids))
            plan = extractor.charge_plan(roots)
            if evaluator is not extractor:
                same_charges(plan, evaluator.charge_plan(roots), cfg.extractor.name)
            if cfg.label_privacy.mode == "pate" and plan.stages:
                raise ValueError(
                    f"label_privacy.mode=pate needs an extractor that A trains without B's labels, but "
                    f"{cfg.extractor.name} trains stage(s) {', '.join(s.name for s in plan.stages)} with them; "
                    "use e.g. relational, or relational-gap with encoder_epochs=0"
                )
            # a resumed run charges as it was calibrated, not as a new calibration might say
            release = self.resume["release"] if resuming else self._release(roots, plan, overrides_root_batches(extractor))
            extractor.bind(release.noise_multiplier)
            if evaluator is not extractor:
                evaluator.bind(release.noise_multiplier)
            if self.canaries is not None:
                self._observe_canaries(extractor, evaluator)
            summary = summary.model_copy(update={
                "split": reply.split, "noise_multiplier": release.noise_multiplier, "noise_std": release.noise_std,
                "sensitivity": release.sensitivity, "participation_bound": release.participation_bound,
                "accountant_requested": cfg.privacy.accountant,
                "sensitivity_form": release.details.get("sensitivity_form", ""),
                "one_shot_releases": plan.one_shot_releases, "pre_train_releases": plan.pre_train_releases,
            })
            if not resuming:
                self._create_run(roots, plan, release, reply.split, extractor)
                run_created = True
                self._save_resume_record(release)
                self._check_plan_fits(roots, plan, release)
            # a resumed run replays the preparation: its releases are recomputed from the same
            # generators, charged again under their keys (the ledger recognises them) and checked
            # against the journal before any is re-sent
            extractor.prepare(_Preparation(self, roots, release))
            eval_index = 0
            if cfg.label_privacy.mode == "pate":
                roots, eval_index, note = self._collect(roots, release, extractor)
                summary = summary.model_copy(update={"label_note": note})
            parameters = extractor.trainable_parameters()
            optimizer = build_optimizer(cfg.optimizer, parameters) if parameters else None
            if cfg.record_gradients:
                self.gradients = GradientRecord(cfg.epochs, reply.num_classes)
            start = self._restore(extractor, optimizer) if self.checkpoint else None
            self._train(roots, release, extractor, optimizer, start)
            if self.gradients is not None:
                self.gradients.save(self._run_dir() / "gradients.npz")
            if evaluator is not extractor:
                evaluator.load_state_dict(extractor.state_dict())
            metrics = self._evaluate(roots, release, evaluator, eval_index)
            self._save(extractor, optimizer)
            if self.canary_statistics is not None:
                self.canary_statistics.save(self._run_dir() / STATISTICS_FILE)
            summary = summary.model_copy(update={
                "status": "completed",
                "test_metric": metrics.get("test"),
                "val_metric": metrics.get("val"),
                "message": "completed",
            })
        except LeaseRefused as exc:
            # another trainer holds the run: this one leaves the run, B's session and the ledger to it
            lost_lease = True
            what = "not resumed" if refused_lease else "stopped without closing it"
            summary = summary.model_copy(update={"status": "failed", "message": f"run {self.run_id} {what}: {exc}"})
        except BudgetRefused as exc:
            summary = summary.model_copy(update={"status": "refused", "message": f"refused by the accountant: {exc}"})
        except Cancelled:
            summary = summary.model_copy(update={"status": "cancelled", "message": "cancelled by the coordinator"})
        except PeerLost as exc:
            if not run_created:
                summary = summary.model_copy(update={"status": "failed", "message": str(exc)})
            else:
                done = f"step {self.checkpoint.position.step}" if self.checkpoint else "the start (no checkpoint yet)"
                summary = summary.model_copy(update={"status": "interrupted", "message": (
                    f"{exc}. Run {self.run_id} is interrupted after {self.steps_done} steps; its last checkpoint is "
                    f"at {done}. Once the {exc.peer} is back: vesper train --resume {self.run_id}"
                )})
                lost_accountant = exc.peer == "accountant"
        except OSError as exc:  # A's own disk (journal, checkpoint, run files): fix it, then resume
            where = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else f"{exc.strerror or exc}"
            if not run_created:
                summary = summary.model_copy(update={"status": "failed", "message": (
                    f"party A cannot write its run files ({where}); nothing was charged. Fix party A's disk "
                    "(party_a.workdir) and start the run again"
                )})
            else:
                summary = summary.model_copy(update={"status": "interrupted", "message": (
                    f"party A cannot write its run files ({where}). Run {self.run_id} is interrupted after "
                    f"{self.steps_done} steps; once party A's disk (party_a.workdir) is fixed: "
                    f"vesper train --resume {self.run_id}"
                )})
        except (PeerError, ValueError) as exc:
            summary = summary.model_copy(update={"status": "failed", "message": str(exc)})
        finally:
            if keeper is not None:
                keeper.stop()
            status = summary.status
            if run_created and not lost_accountant and not lost_lease:
                try:
                    closed = self.accountant.close_run(self.run_id, status, summary.message)
                    self.epsilon_spent = closed.epsilon_spent
                    summary = summary.model_copy(update={
                        "accountant": closed.accountant,
                        "assumption": closed.assumption,
                        "epsilon_events": closed.epsilon_events if closed.HasField("epsilon_events") else None,
                        "epsilon_bound6": closed.epsilon_bound6 if closed.HasField("epsilon_bound6") else None,
                    })
                except PeerError as exc:
                    summary = summary.model_copy(update={"message": f"{summary.message}; {exc}"})
            if b_ready and not lost_lease:
                self.label_party.finish(self.run_id, status, summary.message)
            summary = self._label_ledger_final(summary)
            if not run_created and not resuming:  # the accountant never heard of it: no status URL to show
                summary = summary.model_copy(update={"status_url": ""})
        summary = summary.model_copy(update={
            "epsilon_spent": self.epsilon_spent, "steps": self.steps_done,
            "seconds": round(time.monotonic() - started, 3),
        })
        if not refused_lease:  # a refused second trainer leaves the run's files as they were
            self._write_summary(summary)
        return summary

    # -- set-up ------------------------------------------------------------------------------
    def _plant_canaries(self, roots: RootPlan) -> None:
        """Worst-case canaries (party_a.canaries): pairs of low-degree training roots, planted
        into a new GraphData (the service's cached one is shared by every run)."""
        self.canaries = draw_canaries(
            self.data.graph, self.canary_coins, self.config.audit.canary_seed, roots.train_ids.cpu().numpy(),
            self.config.extractor.fanout,
        )
        if self.canaries.m < self.canary_coins.size:
            self.report(ProgressEvent("setup", message=(
                f"audit.canaries: only {self.canaries.m} of {self.canary_coins.size} canary pairs fit among "
                "B's low-degree training roots"
            )))
        self.data = dataclasses.replace(self.data, graph=plant(self.data.graph, self.canaries))
        self.canaries.save(self._run_dir() / "canaries.npz")  # A's secret until the audit

    def _observe_canaries(self, *extractors: Extractor) -> None:
        """Per-release white-box statistics of the canary endpoints (party_a.canary_statistics),
        for the extractors they cover; nothing of it is sent or charged."""
        reason = unsupported_reason(extractors[0])
        if reason:
            self.report(ProgressEvent("setup", message=f"no per-release canary statistics: {reason}"))
            return
        ex = self.config.extractor
        self.canary_statistics = CanaryStatistics(self.canaries, self.data.graph.num_nodes, ex.dim, ex.layers)
        for extractor in dict.fromkeys(extractors):  # the evaluator may be the extractor itself
            observe_releases(extractor, self.canary_statistics)

    def _build_extractor(self, graph: Graph | None = None) -> Extractor:
        """The run's extractor on ``graph`` (default A's whole graph), from the plugins installed
        at A (ValueError: unknown or misconfigured)."""
        cls = lookup(self.config.extractor.name)
        params = validated_params(cls.spec, self.config)
        self.report(ProgressEvent("setup", message=f"building extractor {cls.spec.name}"))
        setup = ExtractorSetup(
            config=self.config, params=params, graph=self.data.graph if graph is None else graph,
            features=self.data.features,
            device=self.device, sampling_generator=self.sampling_generator,
            noise_generator=self.noise_generator, delta=self.delta,
        )
        return cls(setup)

    def _setup_label_party(self, session_id: str, layers: int, resume_step: int = 0) -> lp_pb.SetupRunReply:
        cfg = self.config
        self.report(ProgressEvent("setup", message=f"setting up {session_id} with party B"))
        request = lp_pb.SetupRunRequest(
            run_id=session_id,
            dataset=cfg.dataset,
            decoder=lp_pb.DecoderSpec(kind=cfg.decoder.kind, hidden_dim=cfg.decoder.hidden_dim, dropout=cfg.decoder.dropout),
            optimizer=lp_pb.OptimizerSpec(name=cfg.optimizer.name, lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay),
            seed=cfg.seed,
            budget=lp_pb.Budget(
                epsilon=cfg.privacy.epsilon, delta=self.delta, accounting=cfg.privacy.accounting,
                status_url=self.status_url,
            ),
            embedding_dim=cfg.extractor.dim,
            num_layers=layers,
            wire_dtype=dtype_to_proto(cfg.wire_dtype),
            split_seed=cfg.split_seed,
            label_privacy_json="" if cfg.label_privacy.mode == "none" else cfg.label_privacy.model_dump_json(),
            label_run_id=self.run_id,
            record_releases=cfg.audit.record_releases and session_id == self.run_id,
            membership_audit=cfg.audit.membership and session_id == self.run_id,
            resume=self.resume is not None,
            resume_step=resume_step,
        )
        return self.label_party.setup(request)

    def _with_labels(self, summary: RunSummary, reply: lp_pb.SetupRunReply) -> RunSummary:
        """What B says about its label ledger (B's own run at the accountant)."""
        if self.config.label_privacy.mode == "none":
            return summary
        if not reply.label_ledger_id:
            raise PeerError("the run asks for label privacy but party B opened no label ledger")
        self.label_ledger_id = reply.label_ledger_id
        return summary.model_copy(update={
            "label_privacy": self.config.label_privacy.mode, "label_run_id": reply.label_ledger_id,
            "label_epsilon_budget": reply.label_epsilon_budget, "label_epsilon_spent": reply.label_epsilon_spent,
            "label_delta": reply.label_delta, "label_note": reply.label_note,
        })

    def _label_ledger_final(self, summary: RunSummary) -> RunSummary:
        """B's label ledger as the accountant has it at the end (B charges it, A only reads)."""
        if not self.label_ledger_id:
            return summary
        try:
            status = self.accountant.get_run(self.label_ledger_id)
        except PeerError as exc:
            return summary.model_copy(update={"message": f"{summary.message}; {exc}"})
        return summary.model_copy(update={"label_epsilon_spent": status.epsilon_spent})

    def _plan(self, reply: lp_pb.SetupRunReply) -> RootPlan:
        num_nodes = self.data.graph.num_nodes
        if reply.num_nodes != num_nodes:
            raise ValueError(
                f"node ids are not aligned: party B's labels cover {reply.num_nodes} nodes, "
                f"party A's graph has {num_nodes}"
            )
        ids = {}
        for name in ("train", "val", "test", "query"):
            values = list(getattr(reply, f"{name}_ids"))
            if not values and name in ("train", "test"):
                raise ValueError(f"party B's split has no {name} nodes")
            ids[name] = (
                validate_node_ids(values, name=f"party B's {name} split", num_nodes=num_nodes)
                if values else torch.empty(0, dtype=torch.int64)
            )
        pate = self.config.label_privacy.mode == "pate"
        if pate and not ids["query"].numel():
            raise ValueError("label privacy pate: party B named no query nodes")
        # both charging forms need every node to be a root at most once per pass; under
        # pate the teachers' nodes and the queries are released in the evaluation pass too
        # (so does TFTS: the training nodes, for the membership attack)
        tfts = self.config.audit.membership
        evaluated = torch.cat([
            ids["val"], ids["test"], *((ids["train"], ids["query"]) if pate else ()), *((ids["train"],) if tfts else ()),
        ])
        if torch.unique(evaluated).numel() != evaluated.numel():
            what = "splits (val, test, training nodes and queries)" if pate else "val and test splits"
            what = "splits (train, val and test)" if tfts else what
            raise ValueError(f"party B's {what} overlap: a node would be released twice in one pass")
        chunk = self.config.eval_chunk
        chunks = sum(math.ceil(ids[name].numel() / chunk) for name in ("val", "test"))
        if pate:
            chunks += math.ceil(ids["train"].numel() / chunk) + math.ceil(ids["query"].numel() / chunk)
        train = ids["query"] if pate else ids["train"]
        roots = RootPlan(
            train_ids=train,
            val_ids=ids["val"],
            test_ids=ids["test"],
            steps_per_epoch=math.ceil(train.numel() / self.config.batch_size),
            eval_chunks=chunks,
            teacher_ids=ids["train"] if pate else torch.empty(0, dtype=torch.int64),
        )
        if tfts:
            train_chunks = math.ceil(train.numel() / tfts_chunk(roots, chunk))
            roots = dataclasses.replace(roots, eval_chunks=chunks + train_chunks)
        return roots

    def _release(self, roots: RootPlan, plan: ChargePlan, chooses_roots: bool = False) -> Release:
        """Each kind's DpEvent: calibrated Gaussian, fixed Gaussian, non-private, or no-op."""
        cfg = self.config
        kinds = [rule.kind for rule in plan.rules]
        if len(set(kinds)) != len(kinds) or not {"train", "eval"} <= set(kinds):
            raise ValueError(f"extractor {cfg.extractor.name} must declare one rule for each of train and eval, got {kinds}")
        if plan.one_shot_releases and "one-shot" not in kinds:
            raise ValueError(f"extractor {cfg.extractor.name} plans one-shot releases but declares no rule for them")
        if plan.pre_train_releases and "pre-train" not in kinds:
            raise ValueError(f"extractor {cfg.extractor.name} plans pre-train releases but declares no rule for them")
        if chooses_roots and any(r.kind == "train" and r.participation_bound is not None for r in plan.rules):
            raise ValueError(
                f"extractor {cfg.extractor.name} chooses its own roots, so its train rule must count every "
                "release (participation_bound None): a root may recur within an epoch"
            )
        if plan.stages and any(r.kind == "train" and r.mechanism != "no-op" for r in plan.rules):
            raise ValueError(f"extractor {cfg.extractor.name} has edge-free stages but a costly train rule")

        def release(rules: list[ChargeRule], z: float | None) -> Release:
            return Release(rules, z, plan.sensitivity, plan.participation_bound, plan.details)

        if all(rule.mechanism == "no-op" for rule in plan.rules):
            return release(_fixed_rules(plan.rules, lambda r: dpa.NoOpDpEvent()), None)
        if math.isinf(cfg.privacy.epsilon):
            return release(_fixed_rules(
                plan.rules, lambda r: dpa.NonPrivateDpEvent() if r.mechanism != "no-op" else dpa.NoOpDpEvent()
            ), None)
        z = cfg.extractor.noise_multiplier
        if z is None:
            self.report(ProgressEvent("setup", message="calibrating the noise to the budget"))
            reply = self.accountant.calibrate(
                plan.passes(cfg.epochs, roots), plan.rules, cfg.privacy.epsilon, self.delta,
                cfg.privacy.accounting, cfg.privacy.accountant,
            )
            z = reply.noise_multiplier
        return release(_fixed_rules(plan.rules, lambda r: r.event(z)), z)

    def _check_plan_fits(self, roots: RootPlan, plan: ChargePlan, release: Release) -> None:
        """Refuse, before anything is sent, a run whose planned releases exceed the budget."""
        privacy = self.config.privacy
        estimate = self.accountant.estimate(
            release.rules, plan.passes(self.config.epochs, roots), self.delta, privacy.accounting, privacy.accountant
        )
        if estimate.epsilon > privacy.epsilon:
            z = "none" if release.noise_multiplier is None else f"{release.noise_multiplier:g}"
            raise BudgetRefused(
                f"the planned run ({estimate.counted_releases} counted releases at noise multiplier "
                f"{z}) needs epsilon {estimate.epsilon:.4g}, above the budget {privacy.epsilon:g}; nothing was sent"
            )

    def _create_run(self, roots: RootPlan, plan: ChargePlan, release: Release, split: str, extractor: Extractor) -> None:
        cfg, ex = self.config, self.config.extractor
        details = {
            "dataset": cfg.dataset,
            "split": split,
            "privacy_unit": extractor.spec.privacy_unit,
            "cost_model": extractor.spec.cost_model,
            "layers": ex.layers,
            "output_layers": extractor.output_layers,
            "fanout": ex.fanout,
            "degree_bound": ex.degree_bound,
            "d_min": ex.d_min,
            "dim": ex.dim,
            "params": ex.params,
            "sensitivity": release.sensitivity,
            "noise_multiplier": release.noise_multiplier,
            "noise_std": release.noise_std,
            "edge_sample_rate": cfg.privacy.edge_sample_rate,
            "epochs": cfg.epochs,
            "batch_size": cfg.batch_size,
            "train_nodes": roots.train_ids.numel(),
            "steps_per_epoch": roots.steps_per_epoch,
            "eval_chunks": roots.eval_chunks,
            "one_shot_releases": plan.one_shot_releases,
            "pre_train_releases": plan.pre_train_releases,
            "relation": _relation(extractor),
            "stages": [{"name": s.name, "epochs": s.epochs, "layers": s.layers} for s in plan.stages],
            **release.details,
        }
        note = f"Privacy unit: {_relation(extractor)}."
        if cfg.privacy.edge_sample_rate:
            note += (
                f" Credited: party A keeps a secret Poisson sample of the edges at rate "
                f"q={cfg.privacy.edge_sample_rate:g} for every release, drawn afresh per release and hidden from B."
            )
        self.accountant.create_run(
            self.run_id, cfg.privacy.epsilon, self.delta, release.rules, ex.name, cfg.privacy.accounting,
            cfg.privacy.accountant, details, note, privacy_unit=extractor.spec.privacy_unit,
        )

    # -- releases ----------------------------------------------------------------------------
    def charge(self, roots: torch.Tensor, release: Release, pass_id: str, kind: str, index: int) -> None:
        """The write-ahead charge: returns only once the accountant has committed it."""
        self._count_receipt(self._commit_charge(roots, release, pass_id, kind, index))

    def _commit_charge(
        self, roots: torch.Tensor, release: Release, pass_id: str, kind: str, index: int
    ) -> acc_pb.ChargeReceipt:
        """The Charge RPC alone (thread-safe: ``_charge_ahead`` runs it on a worker thread)."""
        return self.accountant.charge(
            self.run_id, f"{pass_id}/{index}", pass_id, kind, roots.numel(), nodes_digest(roots),
            release.event_json(kind),
        )

    def _count_receipt(self, receipt: acc_pb.ChargeReceipt) -> None:
        self.epsilon_spent = receipt.epsilon_spent
        self.charges = max(self.charges, receipt.seq + 1)

    def _charge_ahead(
        self, worker: ThreadPoolExecutor, roots: torch.Tensor, release: Release, pass_id: str, index: int
    ) -> _PendingCharge:
        """Start step t+1's write-ahead charge once B has answered step t, while A updates.

        A charge names the release's roots, key and DpEvent, never its values, so it can be
        committed before the release is computed; ``_charged_release`` waits for the receipt
        before anything of the release is encoded or sent, so every release is still charged
        before it leaves A. The one difference: a run that stops after this call and before
        step t+1 is sent (A fails in its update, is cancelled or killed) holds a charge for a
        release B never receives (over-counted, never under-counted; a resume sends it under
        that charge). docs/faults.md.
        """
        future = worker.submit(self._commit_charge, roots, release, pass_id, "train", index)
        return _PendingCharge(f"{pass_id}/{index}", future)

    def _charged_release(
        self, make: Callable[[torch.Tensor], torch.Tensor], roots: torch.Tensor, release: Release,
        pass_id: str, kind: str, index: int, timer: StepTimings | None = None,
        charged: _PendingCharge | None = None,
    ) -> tuple[torch.Tensor, tensor_pb2.Tensor]:
        """The only way A makes a tensor for B: the extractor's release, the charge, and the
        journal entry (or, replayed on resume, the check against it). The caller sends the
        wire message only after this returns. ``charged``: this release's charge, started
        ahead (``_charge_ahead``); it is waited for here, before anything is encoded."""
        timer = timer or _NO_TIMER
        key = f"{pass_id}/{index}"
        if charged is not None and charged.key != key:
            raise RuntimeError(f"the charge started ahead is for {charged.key}, not for the release {key}")
        embeddings = make(roots.to(self.device))
        timer.mark("release")
        if charged is None:
            self.charge(roots, release, pass_id, kind, index)
        else:
            self._count_receipt(charged.future.result())
        timer.mark("charge")
        message = encode_tensor(embeddings, self.config.wire_dtype)
        timer.mark("encode")
        self.journal.before_send(f"{pass_id}/{index}", message)
        timer.mark("journal")
        return embeddings, message

    def _train_epochs(
        self, session_id: str, roots: RootPlan, release: Release, make: Callable[[torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer | None, epochs: int, layers: int, pass_prefix: str, label: str,
        batches: Batches = shuffled_batches, record: GradientRecord | None = None,
        start: Position | None = None, checkpoint: Callable[[Position], None] | None = None,
        prefetch: Callable[[torch.Tensor], None] | None = None, timings: StepTimings | None = None,
    ) -> None:
        """``epochs`` passes over the train roots on B's session ``session_id``, from ``start``
        (a checkpoint's position) if given; ``checkpoint`` is called (and B asked to save)
        every ``checkpoint_every`` steps and after the last.

        ``prefetch(roots)`` (pipelining): called with step t+1's roots once step t is sent, so
        A samples step t+1 while B computes step t. Sampling reads no parameter, and the
        secret sampling generator is consumed in the same order either way, so the releases
        are the same; no prefetch after a step that is checkpointed, whose checkpoint must
        hold the sampling generator as it stands after that step. With prefetching, step t+1's
        charge is also committed while A applies step t's gradient (``_charge_ahead``). ``timings``
        records where each step's time goes."""
        cfg = self.config
        root_order = torch.Generator().manual_seed(cfg.seed)
        total = roots.steps_per_epoch * epochs
        shape_tail = (cfg.extractor.dim, layers)
        step = 0
        if start is not None:
            root_order.set_state(start.root_order)
            step = start.step
        steps = _planned_steps(roots.train_ids, cfg.batch_size, epochs, batches, root_order, start)
        timer = timings or StepTimings()
        stream = self.label_party.training()
        worker = ThreadPoolExecutor(1, thread_name_prefix="charge-ahead") if prefetch is not None else None
        pending: _PendingCharge | None = None
        try:
            upcoming: _PlannedStep | None | object = next(steps, None)
            while isinstance(upcoming, _PlannedStep):
                current, upcoming = upcoming, _NOT_DRAWN
                batch = current.batch
                if self.cancelled():
                    raise Cancelled()
                timer.begin()
                save = checkpoint is not None and (
                    (step + 1) % self.settings.checkpoint_every == 0 or (current.epoch == epochs - 1 and current.last)
                )
                embeddings, message = self._charged_release(
                    make, batch, release, f"{pass_prefix}-{current.epoch}", "train", current.index, timer, pending
                )
                pending = None
                stream.send(lp_pb.TrainStep(
                    run_id=session_id, step=step, node_ids=batch.tolist(), embeddings=message, checkpoint=save,
                ))
                timer.mark("send")
                if prefetch is not None and not save:
                    upcoming = next(steps, None)
                    if upcoming is not None:
                        prefetch(upcoming.batch)
                    timer.mark("prefetch")
                reply = stream.receive(step)
                timer.mark("wait")
                gradient = self._check_reply(reply, session_id, step, (batch.numel(), *shape_tail))
                if isinstance(upcoming, _PlannedStep) and worker is not None and not self.cancelled():
                    # once B has answered well, and during A's update, when B is idle: a third
                    # busy process during B's turn would slow B down on a 2-core host
                    pending = self._charge_ahead(
                        worker, upcoming.batch, release, f"{pass_prefix}-{upcoming.epoch}", upcoming.index
                    )
                if record is not None:
                    record.add(current.epoch, batch, gradient)
                if optimizer is not None and embeddings.requires_grad:
                    optimizer.zero_grad(set_to_none=True)
                    embeddings.backward(gradient.to(self.device))
                    optimizer.step()
                timer.mark("update")
                step += 1
                self.steps_done += 1
                if save:
                    checkpoint(Position(step, current.epoch, current.position + 1, current.epoch_batches, current.drawn))
                self.report(ProgressEvent(
                    "train", current.epoch + 1, epochs, step, total, reply.loss, self.epsilon_spent, label,
                ))
                timer.end()
                if upcoming is _NOT_DRAWN:
                    upcoming = next(steps, None)
        finally:
            if pending is not None:
                pending.future.exception()  # let an unfinished charge settle before the run is closed
            if worker is not None:
                worker.shutdown(wait=True)
            stream.close()

    def train_stage(
        self, roots: RootPlan, release: Release, stage: Stage, make: Callable[[torch.Tensor], torch.Tensor],
        parameters: list[nn.Parameter],
    ) -> None:
        """An extractor's edge-free stage, trained with B in a session of its own."""
        session_id = f"{self.run_id}.{stage.name}"
        self._setup_label_party(session_id, stage.layers)  # on resume: replayed from its start
        status, reason = "failed", "stage did not finish"
        try:
            optimizer = build_optimizer(self.config.optimizer, parameters) if parameters else None
            self._train_epochs(
                session_id, roots, release, make, optimizer, stage.epochs, stage.layers,
                f"{stage.name}", f"{stage.name} epoch",
            )
            status, reason = "completed", "stage completed"
        finally:
            self.label_party.finish(session_id, status, reason)

    def _train(
        self, roots: RootPlan, release: Release, extractor: Extractor, optimizer: torch.optim.Optimizer | None,
        start: Position | None = None,
    ) -> None:
        if not roots.train_ids.numel():
            self.report(ProgressEvent("train", message="no training roots (no query was answered): nothing to train"))
            return
        extractor.train()
        self._train_epochs(
            self.run_id, roots, release, lambda batch: extractor.release(batch, "train"), optimizer,
            self.config.epochs, extractor.output_layers, "train", "",
            getattr(extractor, "root_batches", shuffled_batches), self.gradients,
            start, lambda position: self._save_checkpoint(position, extractor, optimizer),
            getattr(extractor, "prefetch", None) if self.settings.pipeline else None, self.step_timings,
        )
        self.step_timings.save(self._run_dir() / STEP_TIMINGS_FILE)

    # -- checkpoints and resuming (party_a.run_checkpoint, docs/faults.md) ----------------------
    def _save_resume_record(self, release: Release) -> None:
        """Once the run exists at the accountant: what a resumed run needs to replay it."""
        sampling, noise = self.initial_generators
        self.files.save_start({
            "run_id": self.run_id, "config": self.config.model_dump(mode="json"), "delta": self.delta,
            "release": release, "sampling": sampling, "noise": noise,
        })

    def _save_checkpoint(self, position: Position, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> None:
        self.checkpoint = Checkpoint(
            position=position, extractor=extractor.state_dict(),
            optimizer=None if optimizer is None else optimizer.state_dict(),
            sampling=self.sampling_generator.get_state(), noise=self.noise_generator.get_state(),
            charges=self.charges, epsilon_spent=self.epsilon_spent, steps_done=self.steps_done,
        )
        self.files.save_checkpoint(self.checkpoint)
        self.journal.checkpointed()

    def _restore(self, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> Position:
        """The checkpoint's state, over a run replayed up to the end of its preparation."""
        saved = self.checkpoint
        extractor.load_state_dict(saved.extractor)
        if optimizer is not None and saved.optimizer is not None:
            optimizer.load_state_dict(saved.optimizer)
        self.sampling_generator.set_state(saved.sampling)
        self.noise_generator.set_state(saved.noise)
        self.steps_done = saved.steps_done
        self.report(ProgressEvent(
            "train", message=f"resumed from the checkpoint after step {saved.position.step}",
            epsilon_spent=self.epsilon_spent,
        ))
        return saved.position

    def _reopen_run(self) -> None:
        """The ledger decides: the run must still be open at the accountant, and hold every
        charge A's checkpoint counted (otherwise charges were lost and nothing is resumed)."""
        status = self.accountant.get_run(self.run_id)
        if status.status not in ("active", "interrupted"):
            raise ResumeError(f"run {self.run_id} is {status.status} at the accountant; only an interrupted run resumes")
        needed = self.checkpoint.charges if self.checkpoint else 0
        if status.charges < needed:
            raise ResumeError(
                f"the accountant's ledger holds {status.charges} charges of run {self.run_id}, but party A's checkpoint "
                f"after step {self.checkpoint.position.step} was taken after {needed}: charges were lost; not resuming"
            )
        self._take_over(status.status)
        self.epsilon_spent = status.epsilon_spent
        self.report(ProgressEvent("setup", message=(
            f"resuming run {self.run_id}: the ledger holds {status.charges} charges, ε spent {status.epsilon_spent:.4g}"
        ), epsilon_spent=self.epsilon_spent))

    def _take_over(self, status: str) -> None:
        """Reopen the run under this trainer's lease. A run whose trainer was killed still holds that
        trainer's lease until it expires (``party_a.lease_s``): wait that long, no longer; a live
        trainer keeps renewing, and this resume is then refused (LeaseRefused)."""
        deadline = time.monotonic() + self.settings.lease_s + 1.0
        waiting = False
        while True:
            try:
                self.accountant.reopen_run(self.run_id, f"resumed by party A ({status})")
                return
            except LeaseRefused:
                if time.monotonic() > deadline:
                    raise
                if not waiting:
                    waiting = True
                    self.report(ProgressEvent("setup", message=(
                        f"run {self.run_id} still holds its previous trainer's lease: waiting up to "
                        f"{self.settings.lease_s:g} s for it to expire"
                    ), epsilon_spent=self.epsilon_spent))
                time.sleep(0.5)

    def _check_reply(self, reply: lp_pb.TrainStepReply, session_id: str, step: int, shape: tuple[int, ...]) -> torch.Tensor:
        if reply.run_id != session_id or reply.step != step:
            raise PeerError(
                f"party B answered run {reply.run_id!r} step {reply.step} to run {session_id!r} step {step}"
            )
        if not math.isfinite(reply.loss):
            raise PeerError(f"party B reported a non-finite loss at step {reply.step}")
        try:
            return decode_tensor(
                reply.gradient, name="gradient", expected_shape=shape, expected_dtype=self.config.wire_dtype,
                max_elements=self.settings.max_message_mb * 1024 * 1024 // 2,
            )
        except WireError as exc:
            raise PeerError(f"party B sent an unusable gradient at step {reply.step}: {exc}") from None

    @torch.no_grad()
    def _collect(self, roots: RootPlan, release: Release, extractor: Extractor) -> tuple[RootPlan, int, str]:
        """pate: A's frozen embeddings of B's labelled nodes and of the queries, released in
        the evaluation pass; B answers with the answered queries, the student's roots."""
        cfg = self.config
        reply, index = self._evaluation_pass(
            self.label_party.collection(), (("train", roots.teacher_ids), ("query", roots.train_ids)), release,
            extractor, 0, "prepare", "embeddings for B's teachers",
        )
        num_nodes = self.data.graph.num_nodes
        answered = (
            validate_node_ids(
                list(reply.answered_ids), name="party B's answered queries",
                allowed=node_mask(roots.train_ids, num_nodes), num_nodes=num_nodes,
            )
            if reply.answered_ids else torch.empty(0, dtype=torch.int64)
        )
        student = dataclasses.replace(
            roots, train_ids=answered, steps_per_epoch=math.ceil(answered.numel() / cfg.batch_size),
        )
        self.report(ProgressEvent("prepare", message=reply.label_note, epsilon_spent=self.epsilon_spent))
        return student, index, reply.label_note

    @torch.no_grad()
    def _evaluate(self, roots: RootPlan, release: Release, extractor: Extractor, first_index: int = 0) -> dict[str, Metric]:
        parts: list[tuple[str, torch.Tensor]] = [("val", roots.val_ids), ("test", roots.test_ids)]
        if self.config.audit.membership:
            # TFTS: the members come back too, so B can query the model on them
            size = tfts_chunk(roots, self.config.eval_chunk)
            parts = [("train", ids) for ids in roots.train_ids.split(size)] + parts
        result, _ = self._evaluation_pass(
            self.label_party.evaluation(), parts, release, extractor, first_index, "eval", "evaluating",
        )
        return {m.split: Metric(name=m.name, value=m.value) for m in result.metrics}

    def _evaluation_pass(
        self, stream: EvaluationStream, parts: Iterable[tuple[str, torch.Tensor]], release: Release,
        extractor: Extractor, first_index: int, phase: str, label: str,
    ) -> tuple[object, int]:
        """Chunks of the evaluation pass "eval-0" (each node a root once), each charged, then
        sent; returns B's one answer and the next chunk index."""
        extractor.train(False)
        index = first_index
        try:
            for split, ids in parts:
                for chunk in ids.split(self.config.eval_chunk):
                    if self.cancelled():
                        raise Cancelled()
                    self.report(ProgressEvent(phase, message=f"{label} ({split})", epsilon_spent=self.epsilon_spent))
                    _, message = self._charged_release(
                        lambda nodes: extractor.release(nodes, "eval"), chunk, release, "eval-0", "eval", index
                    )
                    index += 1
                    stream.send(lp_pb.EvalChunk(
                        run_id=self.run_id, eval_id=0, split=split, node_ids=chunk.tolist(), embeddings=message,
                    ))
            return stream.result(), index
        except BaseException:
            stream.cancel()
            raise

    # -- records -------------------------------------------------------------------------------
    def _run_dir(self) -> Path:
        path = self.settings.workdir / "runs" / self.run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _save(self, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> None:
        torch.save(
            {
                "extractor": extractor.state_dict(),
                "optimizer": None if optimizer is None else optimizer.state_dict(),
                "config": self.config.model_dump(mode="json"),
            },
            self._run_dir() / "extractor.pt",
        )

    def _write_summary(self, summary: RunSummary) -> None:
        """The summary beside the run's files; the coordinator gets it on the stream either way,
        so a disk that fails here costs the local copy, not the run's ending."""
        try:
            (self._run_dir() / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            log.warning("run %s: cannot write its summary.json (%s)", self.run_id, exc)
