"""One run at party A, its phases in order (the package docstring says what each does)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from vesper.common.config import PartyAConfig, RunConfig, RunSummary
from vesper.common.metrics import NO_COUNTERS, PartyAMetrics
from vesper.common.optim import build_optimizer
from vesper.party_a.extractors.base import (
    ChargePlan,
    Extractor,
    ExtractorSetup,
    RootPlan,
    overrides_root_batches,
    shuffled_batches,
)
from vesper.party_a.extractors.default_choice import with_default_extractor
from vesper.party_a.extractors.edge_free_path import build_extractor, edge_free_layers, unwrapped
from vesper.party_a.extractors.gap import GapExtractor
from vesper.party_a.extractors.registry import (
    AppliedDefaults,
    ExtractorNotFound,
    lookup,
    validated_params,
    with_run_defaults,
)
from vesper.party_a.graph_store import Graph
from vesper.party_a.membership_audit import same_charges
from vesper.party_a.peers import AccountantClient, LabelPartyClient, LeaseRefused, PeerError
from vesper.party_a.run import summary as summaries
from vesper.party_a.run.audit_hooks import RunHooks
from vesper.party_a.run.charger import WriteAheadCharger
from vesper.party_a.run.checkpoint_files import RunFiles
from vesper.party_a.run.checkpoints import RunCheckpoints
from vesper.party_a.run.context import RunContext
from vesper.party_a.run.evaluation import Scores, collect, evaluate
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.run.label_session import root_plan, setup_request
from vesper.party_a.run.lease import LeaseKeeper
from vesper.party_a.run.preparation import Preparation, continue_optimiser
from vesper.party_a.run.progress import ProgressEvent, Report
from vesper.party_a.run.release import Release, check_plan_fits, plan_release, with_prediction
from vesper.party_a.run.secrets import SecretGenerators
from vesper.party_a.run.step_loop import STEP_TIMINGS_FILE, StepLoop, TrainingPass
from vesper.party_a.run.step_timings import StepTimings
from vesper.party_a.workers import (
    DistributedExtractor,
    GroupReservation,
    WorkerGroup,
    WorkersUnsupported,
    check_supported,
)
from vesper.party_a.workers.hops import PartitionedHops
from vesper.party_a.workers.protocol import WorkerSetup
from vesper.proto.v1 import label_party_pb2 as lp_pb


class GraphPartyRun:
    def __init__(
        self,
        config: RunConfig,
        settings: PartyAConfig,
        data: GraphData,
        label_party: LabelPartyClient,
        accountant: AccountantClient,
        report: Report = lambda event: None,
        cancelled: Callable[[], bool] = lambda: False,
        resume: dict | None = None,
        metrics: PartyAMetrics | None = None,
        dataset_path: Path | None = None,
    ) -> None:
        """``resume``: the run's resume record (party_a.run.checkpoint_files), to continue it;
        ``metrics``: the service's, where the run's steps and releases are counted;
        ``dataset_path``: the file ``data`` was loaded from (needed by W > 1 workers, which map it)."""
        if resume is None:  # a resumed run has its settings, defaults applied, in its record
            config, why = with_default_extractor(config, data.graph.num_nodes)
            if why:
                report(ProgressEvent("setup", message=why))
            try:
                config, applied = with_run_defaults(config)
            except ExtractorNotFound:  # the run fails in its set-up, saying so (_build_extractor)
                applied = AppliedDefaults()
            if applied.own:
                report(ProgressEvent("setup", message=(
                    f"{config.extractor.name}'s own defaults for what the run did not set: "
                    + ", ".join(f"{key}={value}" for key, value in applied.own.items())
                )))
            if applied.path:
                report(ProgressEvent("setup", message=(
                    "its edge-free path keeps the MLP baseline's settings: "
                    + ", ".join(f"{key}={value}" for key, value in applied.path.items())
                )))
        self.config = config
        self.settings = settings
        self.data = data
        self.accountant = accountant
        self.report = report
        self.resume = resume
        self.run_id = resume["run_id"] if resume else uuid.uuid4().hex[:12]
        # this trainer's lease: every spending call at the accountant carries it (party_a.run.lease)
        self.accountant.hold(uuid.uuid4().hex, settings.lease_s)
        # δ is public, declared with the run: never a statistic of A's graph (docs/privacy.md, section 1)
        self.delta = resume["delta"] if resume else config.privacy.delta
        self.status_url = f"{settings.accountant_status_url.rstrip('/')}/v1/runs/{self.run_id}"
        device = data.features.device
        # W > 1 workers need each node's noise keyed (docs/privacy.md 2.6); one process streams it,
        # cheaper; a resumed run keeps the form it began with (its releases are replayed)
        self.keyed_noise = bool(resume.get("keyed_noise", False)) if resume else settings.workers > 1
        self.generators = SecretGenerators(settings, config.seed, device, resume)
        run_dir = settings.workdir / "runs" / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        files = RunFiles(run_dir)
        counters = metrics.for_run(self.run_id) if metrics is not None else NO_COUNTERS
        self.charger = WriteAheadCharger(accountant, self.run_id, files.journal(), config, device, report, counters)
        self.ctx = RunContext(
            config, settings, self.run_id, device, label_party, self.charger, report, cancelled, counters=counters,
        )
        self.checkpoints = RunCheckpoints(self.ctx, files, self.generators, resume is not None)
        self.hooks = RunHooks.for_run(config, settings, report, self.ctx.run_dir)
        self.step_timings = StepTimings()  # the main session's, saved as runs/<id>/step_timings.json
        self.milestones = summaries.Milestones()
        self.summary = summaries.initial(self.run_id, config, self.delta, self.status_url)
        self.keeper: LeaseKeeper | None = None
        self.dataset_path = dataset_path
        self.workers: WorkerGroup | None = None  # party_a.workers > 1: the run's worker processes
        self.reservation: GroupReservation | None = None  # and its hold on them, from its start

    @property
    def epsilon_spent(self) -> float:
        return self.charger.epsilon_spent

    # -- the run -------------------------------------------------------------------------------
    def execute(self) -> RunSummary:
        """The run's phases; however it stops, the accountant's run and B's session are closed
        and the summary says how (party_a.run.summary)."""
        started = time.monotonic()
        try:
            self._phases()
        except summaries.ENDINGS as exc:
            latest = self.checkpoints.latest
            self.summary = summaries.ended(
                self.summary, exc, self.milestones, self.ctx.steps_done, latest.position.step if latest else None,
            )
        finally:
            self._close()
        self.summary = self.summary.model_copy(update={
            "epsilon_spent": self.epsilon_spent, "steps": self.ctx.steps_done,
            "seconds": round(time.monotonic() - started, 3),
        })
        if not self.milestones.refused_lease:  # a refused second trainer leaves the run's files as they were
            summaries.write(self.ctx.run_dir, self.summary)
        return self.summary

    def _phases(self) -> None:
        """set-up with B and the accountant, preparation, training, evaluation [VESPER, Alg. 3]."""
        cfg, resuming = self.config, self.resume is not None
        extractor = self._build_extractor()
        self.hooks.check(unwrapped(extractor))
        self.summary = summaries.with_extractor(self.summary, extractor, self.delta)
        check_supported(cfg, self.settings.workers)  # before anything is charged (party_a.workers)
        if self.settings.workers > 1 and not self.keyed_noise:
            raise WorkersUnsupported(
                f"run {self.run_id} began in one process, with its noise streamed, not keyed per node: its "
                "releases cannot be split over workers (docs/privacy.md 2.6); resume it with "
                "party_a.workers = 1 (vesper serve party-a --workers 1); nothing was charged"
            )
        if self.settings.workers > 1:  # one run at a time: a second is refused now, before any charge
            self.reservation = GroupReservation(self.settings.workers)
        self._hold_run()
        reply = self._open_session(
            self.run_id, extractor.output_layers, self.checkpoints.resume_step, edge_free_layers(extractor),
        )
        self.milestones.b_ready = True
        self.summary = summaries.with_labels(cfg, self.summary, reply)
        roots = root_plan(cfg, reply, self.data.shared_nodes)
        extractor, evaluator = self._extractors(roots, reply.num_classes, extractor)
        plan, release = self._charges(roots, extractor, evaluator)
        self.summary = summaries.with_release(self.summary, cfg, reply.split, release, plan)
        if not resuming:
            self._create_run(roots, plan, release, reply.split, extractor)
        self._split_hops(extractor)
        # a resumed run replays the preparation: its releases are recomputed from the same
        # generators, charged again under their keys (the ledger recognises them) and checked
        # against the journal before any is re-sent
        preparation = Preparation(self.ctx, roots, release, self._open_session)
        extractor.prepare(preparation)
        eval_index = 0
        if cfg.label_privacy.mode == "pate":
            roots, eval_index, note = collect(self.ctx, roots, release, extractor, self.data.shared_nodes)
            self.summary = self.summary.model_copy(update={"label_note": note})
        extractor, evaluator = self._distributed(extractor, evaluator)
        optimizer = self._train(roots, release, extractor, preparation)
        if evaluator is not extractor:
            evaluator.load_state_dict(extractor.state_dict())
        metrics = evaluate(self.ctx, roots, release, evaluator, eval_index, self.hooks.evaluation_parts)
        self._save(evaluator, optimizer)  # the model that evaluated (and predicts): TFTS's full-graph copy
        self.hooks.on_finish(self.ctx.run_dir())
        self._completed(metrics)

    # -- set-up ------------------------------------------------------------------------------
    def _build_extractor(self, graph: Graph | None = None) -> Extractor:
        """The run's extractor on ``graph`` (default A's whole graph), from the plugins installed
        at A (ValueError: unknown or misconfigured)."""
        cls = lookup(self.config.extractor.name)
        params = validated_params(cls.spec, self.config)
        self.report(ProgressEvent("setup", message=f"building extractor {cls.spec.name}"))
        setup = ExtractorSetup(
            config=self.config, params=params, graph=self.data.graph if graph is None else graph,
            features=self.data.features, device=self.ctx.device, sampling_generator=self.generators.sampling,
            noise_generator=self.generators.noise, delta=self.delta, keyed_noise=self.keyed_noise,
            edge_free_key=self.generators.edge_free,
        )
        return build_extractor(cls, setup)

    def _distributed(self, extractor: Extractor, evaluator: Extractor) -> tuple[Extractor, Extractor]:
        """``party_a.workers`` > 1: the extractor that trains and evaluates (the same one: no audit
        rebuilt it, check_supported), its releases split over worker processes started now, just
        before the first release, each building the run's extractor from the secret generators as
        they stood when rank 0 built it (party_a.workers). A failed start charged nothing."""
        if self.settings.workers <= 1 or isinstance(unwrapped(extractor), GapExtractor):
            return extractor, evaluator  # GAP: only its hops were split (_split_hops); its steps read them
        distributed = DistributedExtractor(extractor, self._start_workers())
        return distributed, distributed  # type: ignore[return-value]

    def _split_hops(self, extractor: Extractor) -> None:
        """``party_a.workers`` > 1 and GAP (or relational-gap): its hops split by rows over worker
        processes started when the hops begin (after the edge-free stage and any pre-training,
        which rank 0 runs alone) and stopped when they end (party_a.workers.hops)."""
        inner = unwrapped(extractor)
        if self.settings.workers <= 1 or not isinstance(inner, GapExtractor):
            return
        setup = inner.setup
        inner.hop_engine = lambda: PartitionedHops(self._start_workers(), setup.graph, setup.noise)

    def _start_workers(self) -> WorkerGroup:
        """The run's W − 1 worker processes, each building the run's extractor from the secret
        generators as they stood when rank 0 built it (party_a.workers). A failed start sends nothing."""
        count = self.settings.workers
        if self.dataset_path is None:
            raise ValueError("party_a.workers > 1 needs the dataset's file, which this run was not given")
        self.report(ProgressEvent("setup", message=f"starting {count - 1} worker processes (party_a.workers = {count})"))
        setup = WorkerSetup(
            run_config_json=self.config.model_dump_json(), dataset=self.dataset_path.resolve(),
            device=str(self.ctx.device), delta=self.delta, torch_threads=self.settings.torch_threads,
            edge_free_key=self.generators.edge_free,
        )
        if self.workers is not None:
            self.workers.close()  # a group that served the run's hops has stopped already; closing twice is safe
        self.workers = WorkerGroup.start(
            self.settings, setup, self.generators.initial, self.ctx.run_dir(), self.reservation,
        )
        return self.workers

    def _hold_run(self) -> None:
        """A run has one trainer (accountant/leases.py): its lease first, before party B hears of the run."""
        resuming = self.resume is not None
        try:
            if resuming:
                latest = self.checkpoints.latest
                self.charger.reopen(
                    latest.charges if latest else 0, latest.position.step if latest else None, self.settings.lease_s,
                )
            else:
                self.accountant.announce_run(self.run_id)
        except LeaseRefused:
            self.milestones.refused_lease = True
            raise
        self.milestones.run_created = resuming
        self.keeper = LeaseKeeper(self.accountant, self.run_id, self.settings.lease_s).start()

    def _open_session(
        self, session_id: str, layers: int, resume_step: int = 0, edge_free: int = 0,
    ) -> lp_pb.SetupRunReply:
        """B's session of ``layers`` slices, the last ``edge_free`` of them the edge-free path's."""
        self.report(ProgressEvent("setup", message=f"setting up {session_id} with party B"))
        return self.ctx.label_party.setup(setup_request(
            self.config, self.run_id, session_id, layers, self.delta, self.status_url, self.resume is not None,
            resume_step, edge_free,
        ))

    def _extractors(self, roots: RootPlan, num_classes: int, extractor: Extractor) -> tuple[Extractor, Extractor]:
        """The extractor that trains and the one that evaluates (the same but under TFTS), on
        the graph the audit hooks leave (canaries planted)."""
        data = self.hooks.on_roots(roots, self.data, num_classes)
        if data is not self.data:
            self.data = data
            extractor = self._build_extractor()  # on the planted graph
        training_graph = self.hooks.training_graph(self.data, roots)
        if training_graph is None:
            return extractor, extractor
        return self._build_extractor(training_graph), extractor

    def _charges(self, roots: RootPlan, extractor: Extractor, evaluator: Extractor) -> tuple[ChargePlan, Release]:
        """The plan of every release and how each is charged; the extractors get their noise."""
        cfg = self.config
        plan = extractor.charge_plan(roots)
        if evaluator is not extractor:
            same_charges(plan, evaluator.charge_plan(roots), cfg.extractor.name)
        if cfg.label_privacy.mode == "pate" and plan.stages:
            raise ValueError(
                f"label_privacy.mode=pate needs an extractor that A trains without B's labels, but "
                f"{cfg.extractor.name} trains stage(s) {', '.join(s.name for s in plan.stages)} with them; "
                "use e.g. relational, or relational-gap with encoder_epochs=0"
            )
        plan = with_prediction(plan, cfg, extractor.spec.no_prediction)
        # a resumed run charges as it was calibrated, not as a new calibration might say
        release = self.resume["release"] if self.resume else plan_release(
            cfg, plan, lambda: self._calibrate(roots, plan), overrides_root_batches(unwrapped(extractor)),
        )
        extractor.bind(release.noise_multiplier)
        if evaluator is not extractor:
            evaluator.bind(release.noise_multiplier)
        self.hooks.on_bound(unwrapped(extractor), unwrapped(evaluator))
        return plan, release

    def _calibrate(self, roots: RootPlan, plan: ChargePlan) -> float:
        cfg = self.config
        self.report(ProgressEvent("setup", message="calibrating the noise to the budget"))
        reply = self.accountant.calibrate(
            plan.passes(cfg.epochs, roots), plan.rules, cfg.privacy.epsilon, self.delta,
            cfg.privacy.accounting, cfg.privacy.accountant,
        )
        return reply.noise_multiplier

    def _create_run(self, roots: RootPlan, plan: ChargePlan, release: Release, split: str, extractor: Extractor) -> None:
        self.charger.create(self.delta, roots, plan, release, split, extractor)
        self.milestones.run_created = True
        self.checkpoints.save_resume_record(self.delta, release)
        check_plan_fits(self.accountant, self.config, self.delta, roots, plan, release)

    # -- training ------------------------------------------------------------------------------
    def _train(
        self, roots: RootPlan, release: Release, extractor: Extractor, preparation: Preparation,
    ) -> torch.optim.Optimizer | None:
        """The main training pass (from the checkpoint when resuming, else going on from the
        optimisers and the root order of the stages it continues); the optimiser it trained."""
        parameters = extractor.trainable_parameters()
        optimizer = build_optimizer(self.config.optimizer, parameters) if parameters else None
        start = self.checkpoints.restore(extractor, optimizer) if self.checkpoints.latest else None
        if start is None and optimizer is not None:
            continue_optimiser(optimizer, preparation.continued)
        if not roots.train_ids.numel():
            self.report(ProgressEvent("train", message="no training roots (no query was answered): nothing to train"))
            return optimizer
        extractor.train()
        StepLoop(self.ctx, TrainingPass(
            self.run_id, roots, release, lambda batch: extractor.release(batch, "train"), optimizer,
            self.config.epochs, extractor.output_layers, "train", "",
            batches=getattr(extractor, "root_batches", shuffled_batches), on_step=self.hooks.on_step, start=start,
            checkpoint=lambda position: self.checkpoints.save(position, extractor, optimizer),
            prefetch=getattr(extractor, "prefetch", None) if self.settings.pipeline else None,
            timings=self.step_timings, backward=getattr(extractor, "backward", None), root_order=preparation.root_order,
        )).run()
        self.step_timings.save(self.ctx.run_dir() / STEP_TIMINGS_FILE)
        return optimizer

    # -- the end ---------------------------------------------------------------------------------
    def _save(self, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> None:
        torch.save(
            {
                "extractor": extractor.state_dict(),
                "optimizer": None if optimizer is None else optimizer.state_dict(),
                "config": self.config.model_dump(mode="json"),
                "serving": extractor.serving_state(),  # charged one-shot releases a prediction pass serves
            },
            self.ctx.run_dir() / "extractor.pt",
        )

    def _completed(self, scores: Scores) -> None:
        metrics = scores.metrics
        self.summary = self.summary.model_copy(update={
            "status": "completed", "test_metric": metrics.get("test"), "val_metric": metrics.get("val"),
            "decoder_head": scores.head, "head_metrics": scores.head_metrics,
            "head_errors": scores.head_errors, "message": "completed",
        })

    def _close(self) -> None:
        """However the run stopped: the lease released, the run closed at the accountant (unless
        lost), B told how it ended, B's label ledger read back."""
        if self.keeper is not None:
            self.keeper.stop()
        if self.workers is not None:
            self.workers.close()
        if self.reservation is not None:
            self.reservation.release()
        done, summary = self.milestones, self.summary
        if done.run_created and not done.lost_accountant and not done.lost_lease:
            try:
                summary = summaries.with_closed(summary, self.charger.close(summary.status, summary.message))
                if summary.status != "interrupted":  # closed for good: never resumed, the bytes kept for it go
                    self.charger.journal.discard_kept()
            except PeerError as exc:
                summary = summary.model_copy(update={"message": f"{summary.message}; {exc}"})
        if done.b_ready and not done.lost_lease:
            self.ctx.label_party.finish(self.run_id, summary.status, summary.message)
        summary = summaries.with_label_ledger(summary, self.accountant)
        if not done.run_created and self.resume is None:  # the accountant never heard of it: no status URL to show
            summary = summary.model_copy(update={"status_url": ""})
        self.summary = summary
