"""Party A's side of one run: VESPER's Algorithm 3 with write-ahead charging.

    set-up   B tells A the split; A plans its releases, the accountant calibrates θ
    train    per step: sample roots' subgraphs, encode, PMP (noise θ), charge, send
             B x d x L to B, receive dLoss/dH, update encoder and extractor
    evaluate per chunk of validation/test nodes: PMP, charge, send; B returns metrics

Nothing leaves A before the accountant has committed its charge, and a refused
charge ends the run cleanly without sending. The run's plan (epochs x steps plus one
evaluation sweep) is exactly what is charged, so a calibrated run ends with
ε spent = the calibrated ε ≤ budget.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dp_accounting as dpa
import torch

from vesper.common.config import Metric, PartyAConfig, RunConfig, RunSummary
from vesper.common.dataset_files import load_graph_part
from vesper.common.optim import build_optimizer
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, PlannedPass, PlanRule
from vesper.common.privacy.theorem21 import theorem21_gamma
from vesper.common.wire import WireError, decode_tensor, dtype_to_proto, encode_tensor, validate_node_ids
from vesper.party_a.degree_projection import project_degree
from vesper.party_a.edge_sampling import EdgeSubsampler
from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.extractors.sensitivity import charge_rule
from vesper.party_a.graph_store import Graph, build_graph
from vesper.party_a.peers import (
    AccountantClient,
    BudgetRefused,
    LabelPartyClient,
    PeerError,
)
from vesper.party_a.sampler import NeighbourSampler, edgeless_subgraph
from vesper.proto.v1 import label_party_pb2 as lp_pb


@dataclass(frozen=True)
class GraphData:
    """What party A loads once per dataset: its graph and its node features."""

    graph: Graph
    features: torch.Tensor

    @classmethod
    def load(cls, path: Path, device: torch.device) -> GraphData:
        part = load_graph_part(path)
        graph = build_graph(part.edges, part.num_nodes).to(device)
        return cls(graph, torch.from_numpy(part.features).to(device))


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
class ReleasePlan:
    train_ids: torch.Tensor
    val_ids: torch.Tensor
    test_ids: torch.Tensor
    steps_per_epoch: int
    eval_chunks: int

    def passes(self, epochs: int) -> list[PlannedPass]:
        return [PlannedPass(kind="train", releases=self.steps_per_epoch)] * epochs + [
            PlannedPass(kind="eval", releases=self.eval_chunks)
        ]


@dataclass(frozen=True)
class Release:
    """How each release is privatised and what each kind of release is charged."""

    rules: list[ChargeRule]
    noise_multiplier: float | None
    noise_std: float
    sensitivity: float
    participation_bound: int | None
    details: dict

    def event_json(self, kind: str) -> str:
        return next(rule.release_event for rule in self.rules if rule.kind == kind)


def _fixed_rules(plan_rules: list[PlanRule], event_of: Callable[[PlanRule], dpa.DpEvent]) -> list[ChargeRule]:
    return [
        ChargeRule(kind=r.kind, release_event=event_to_json(event_of(r)), participation_bound=r.participation_bound)
        for r in plan_rules
    ]


def nodes_digest(node_ids: torch.Tensor) -> str:
    """What the accountant stores to recognise a retried charge as the same release."""
    return hashlib.sha256(node_ids.cpu().to(torch.int64).numpy().tobytes()).hexdigest()[:32]


def _secret_generators(settings: PartyAConfig, run_seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    """Generators for neighbour sampling and noise, never derived from anything B knows."""
    if settings.secret_seed is None:
        base = int.from_bytes(os.urandom(8), "little") >> 1
    else:
        base = (settings.secret_seed * 1_000_003 + run_seed) % (1 << 62)
    sampling = torch.Generator().manual_seed(base)
    noise = torch.Generator(device=device).manual_seed(base ^ 0x5DEECE66D)
    return sampling, noise


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
    ) -> None:
        self.config = config
        self.settings = settings
        self.data = data
        self.device = data.features.device
        self.label_party = label_party
        self.accountant = accountant
        self.report = report
        self.cancelled = cancelled
        self.run_id = uuid.uuid4().hex[:12]
        self.delta = config.privacy.delta or 1.0 / max(2, data.graph.num_edges)
        self.epsilon_spent = 0.0
        self.steps_done = 0
        self.status_url = f"{settings.accountant_status_url.rstrip('/')}/v1/runs/{self.run_id}"
        self.sampling_generator, self.noise_generator = _secret_generators(settings, config.seed, self.device)
        ex = config.extractor
        self.graph = data.graph
        if ex.name != "mlp" and ex.degree_bound > 0:
            # the stable degree-D projection, under a seed only A knows (docs/privacy.md, 3.5)
            seed = torch.randint(0, 1 << 32, (2,), generator=self.sampling_generator, dtype=torch.int64).tolist()
            self.graph = project_degree(data.graph, ex.degree_bound, (seed[0], seed[1]))
        self.fanout = 0 if ex.degree_bound > 0 else ex.fanout  # a projection is read whole
        self.sampler = None if ex.name == "mlp" else NeighbourSampler(self.graph, self.fanout, ex.layers)
        rate = config.privacy.edge_sample_rate
        self.edge_subsampler = EdgeSubsampler(self.graph, rate) if rate and self.sampler else None

    # -- the run -------------------------------------------------------------------------------
    def execute(self) -> RunSummary:
        started = time.monotonic()
        cfg = self.config
        summary = RunSummary(
            run_id=self.run_id, status="failed", dataset=cfg.dataset, extractor=cfg.extractor.name,
            decoder=cfg.decoder.kind, accounting=cfg.privacy.accounting, epsilon_budget=cfg.privacy.epsilon,
            epsilon_spent=0.0, delta=self.delta, status_url=self.status_url,
        )
        b_ready = run_created = False
        try:
            reply = self._setup_label_party()
            b_ready = True
            plan = self._plan(reply)
            release = self._release(plan)
            summary = summary.model_copy(update={
                "split": reply.split, "noise_multiplier": release.noise_multiplier, "noise_std": release.noise_std,
                "sensitivity": release.sensitivity, "participation_bound": release.participation_bound,
                "accountant_requested": cfg.privacy.accountant,
                "sensitivity_form": release.details.get("sensitivity_form", ""),
            })
            self._create_run(plan, release, reply.split)
            run_created = True
            self._check_plan_fits(plan, release)
            model, optimizer = self._build_model()
            self._train(plan, release, model, optimizer)
            metrics = self._evaluate(plan, release, model)
            self._save(model, optimizer)
            summary = summary.model_copy(update={
                "status": "completed",
                "test_metric": metrics.get("test"),
                "val_metric": metrics.get("val"),
                "message": "completed",
            })
        except BudgetRefused as exc:
            summary = summary.model_copy(update={"status": "refused", "message": f"refused by the accountant: {exc}"})
        except Cancelled:
            summary = summary.model_copy(update={"status": "cancelled", "message": "cancelled by the coordinator"})
        except (PeerError, ValueError) as exc:
            summary = summary.model_copy(update={"status": "failed", "message": str(exc)})
        finally:
            status = summary.status
            if run_created:
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
            if b_ready:
                self.label_party.finish(self.run_id, status, summary.message)
        summary = summary.model_copy(update={
            "epsilon_spent": self.epsilon_spent, "steps": self.steps_done,
            "seconds": round(time.monotonic() - started, 3),
        })
        self._write_summary(summary)
        return summary

    # -- set-up ------------------------------------------------------------------------------
    def _setup_label_party(self) -> lp_pb.SetupRunReply:
        cfg = self.config
        self.report(ProgressEvent("setup", message=f"setting up run {self.run_id} with party B"))
        request = lp_pb.SetupRunRequest(
            run_id=self.run_id,
            dataset=cfg.dataset,
            decoder=lp_pb.DecoderSpec(kind=cfg.decoder.kind, hidden_dim=cfg.decoder.hidden_dim, dropout=cfg.decoder.dropout),
            optimizer=lp_pb.OptimizerSpec(name=cfg.optimizer.name, lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay),
            seed=cfg.seed,
            budget=lp_pb.Budget(
                epsilon=cfg.privacy.epsilon, delta=self.delta, accounting=cfg.privacy.accounting,
                status_url=self.status_url,
            ),
            embedding_dim=cfg.extractor.dim,
            num_layers=cfg.extractor.layers,
            wire_dtype=dtype_to_proto(cfg.wire_dtype),
            split_seed=cfg.split_seed,
        )
        return self.label_party.setup(request)

    def _plan(self, reply: lp_pb.SetupRunReply) -> ReleasePlan:
        num_nodes = self.data.graph.num_nodes
        if reply.num_nodes != num_nodes:
            raise ValueError(
                f"node ids are not aligned: party B's labels cover {reply.num_nodes} nodes, "
                f"party A's graph has {num_nodes}"
            )
        ids = {}
        for name in ("train", "val", "test"):
            values = list(getattr(reply, f"{name}_ids"))
            if not values and name != "val":
                raise ValueError(f"party B's split has no {name} nodes")
            ids[name] = (
                validate_node_ids(values, name=f"party B's {name} split", num_nodes=num_nodes)
                if values else torch.empty(0, dtype=torch.int64)
            )
        # both charging forms need every node to be a root at most once per pass
        evaluated = torch.cat([ids["val"], ids["test"]])
        if torch.unique(evaluated).numel() != evaluated.numel():
            raise ValueError("party B's val and test splits overlap: a node would be released twice in one pass")
        chunk = self.config.eval_chunk
        return ReleasePlan(
            train_ids=ids["train"],
            val_ids=ids["val"],
            test_ids=ids["test"],
            steps_per_epoch=math.ceil(ids["train"].numel() / self.config.batch_size),
            eval_chunks=math.ceil(ids["val"].numel() / chunk) + math.ceil(ids["test"].numel() / chunk),
        )

    def _plan_rules(self, plan: ReleasePlan) -> tuple[list[PlanRule], float, dict]:
        """Each kind's charge as a function of z, and the sensitivity θ = z · S refers to.

        visible-batch: both kinds are charged the extractor's rule (docs/privacy.md,
        section 4). hidden-batch: training steps are PoissonSampled(γ, Gaussian(θ/S_step))
        with γ of VESPER Theorem 2.1, every step counted; the evaluation sweep has no
        sampling to hide behind and is charged as under visible-batch.
        """
        cfg, ex = self.config, self.config.extractor
        rule = charge_rule(ex.name, ex.layers, self.fanout, ex.d_min, ex.degree_bound)
        details = {"sensitivity_form": rule.form, "derivation": rule.derivation}
        q = cfg.privacy.edge_sample_rate
        if q is not None and ex.name != "mlp":
            # releases with independent coins: the per-step form (docs/privacy.md, 5.2, eq. L2)
            details.update({"sensitivity_form": "per-step", "edge_sample_rate": q})
            rules = [
                PlanRule(kind=kind, participation_bound=rule.edge_reach, sampling_probability=q)
                for kind in ("train", "eval")
            ]
            return rules, rule.step_sensitivity, details
        visible = [PlanRule(kind=kind, participation_bound=rule.participation_bound) for kind in ("train", "eval")]
        if cfg.privacy.accounting == "visible-batch" or ex.name == "mlp":
            return visible, rule.sensitivity, details
        degree = ex.degree_bound or ex.fanout
        gamma = theorem21_gamma(plan.train_ids.numel(), min(cfg.batch_size, plan.train_ids.numel()), degree, ex.layers)
        details.update({
            "gamma": gamma, "gamma_degree": degree, "step_sensitivity": rule.step_sensitivity,
            "sensitivity_form": "per-step", "eval_sensitivity_form": rule.form,
        })
        hidden = [
            PlanRule(kind="train", participation_bound=None, sampling_probability=gamma),
            PlanRule(
                kind="eval", participation_bound=rule.participation_bound,
                noise_scale=rule.step_sensitivity / rule.sensitivity,
            ),
        ]
        return hidden, rule.step_sensitivity, details

    def _release(self, plan: ReleasePlan) -> Release:
        """Choose each release's DpEvent: calibrated Gaussian, fixed Gaussian, none, or no-op."""
        cfg, ex = self.config, self.config.extractor
        plan_rules, sensitivity, details = self._plan_rules(plan)
        bound = plan_rules[0].participation_bound
        if ex.name == "mlp":
            return Release(_fixed_rules(plan_rules, lambda r: dpa.NoOpDpEvent()), None, 0.0, 0.0, 0, details)
        if math.isinf(cfg.privacy.epsilon):
            rules = _fixed_rules(plan_rules, lambda r: dpa.NonPrivateDpEvent())
            return Release(rules, None, 0.0, sensitivity, bound, details)
        if ex.noise_multiplier is not None:
            z = ex.noise_multiplier
            rules = _fixed_rules(plan_rules, lambda r: r.event(z))
        else:
            self.report(ProgressEvent("setup", message="calibrating the noise to the budget"))
            reply = self.accountant.calibrate(
                plan.passes(cfg.epochs), plan_rules, cfg.privacy.epsilon, self.delta,
                cfg.privacy.accounting, cfg.privacy.accountant,
            )
            z = reply.noise_multiplier
            rules = _fixed_rules(plan_rules, lambda r: r.event(z))
        return Release(rules, z, z * sensitivity, sensitivity, bound, details)

    def _check_plan_fits(self, plan: ReleasePlan, release: Release) -> None:
        """Refuse, before anything is sent, a run whose planned releases exceed the budget."""
        privacy = self.config.privacy
        estimate = self.accountant.estimate(
            release.rules, plan.passes(self.config.epochs), self.delta, privacy.accounting, privacy.accountant
        )
        if estimate.epsilon > privacy.epsilon:
            raise BudgetRefused(
                f"the planned run ({estimate.counted_releases} counted releases at noise multiplier "
                f"{release.noise_multiplier:g}) needs epsilon {estimate.epsilon:.4g}, above the budget "
                f"{privacy.epsilon:g}; nothing was sent"
            )

    def _create_run(self, plan: ReleasePlan, release: Release, split: str) -> None:
        cfg, ex = self.config, self.config.extractor
        details = {
            "dataset": cfg.dataset,
            "split": split,
            "layers": ex.layers,
            "fanout": ex.fanout,
            "degree_bound": ex.degree_bound,
            "d_min": ex.d_min,
            "dim": ex.dim,
            "sensitivity": release.sensitivity,
            "noise_multiplier": release.noise_multiplier,
            "noise_std": release.noise_std,
            "edge_sample_rate": cfg.privacy.edge_sample_rate,
            "epochs": cfg.epochs,
            "batch_size": cfg.batch_size,
            "train_nodes": plan.train_ids.numel(),
            "steps_per_epoch": plan.steps_per_epoch,
            "eval_chunks": plan.eval_chunks,
            **release.details,
        }
        note = ""
        if cfg.privacy.edge_sample_rate:
            note = (
                f"Credited: party A keeps a secret Poisson sample of the edges at rate "
                f"q={cfg.privacy.edge_sample_rate:g} for every release, drawn afresh per release and hidden from B."
            )
        self.accountant.create_run(
            self.run_id, cfg.privacy.epsilon, self.delta, release.rules, ex.name, cfg.privacy.accounting,
            cfg.privacy.accountant, details, note,
        )

    def _build_model(self) -> tuple[PmpExtractor, torch.optim.Optimizer]:
        ex = self.config.extractor
        capped = self._capped_degree(self.graph)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            model = PmpExtractor(ex, self.data.features.shape[1], capped).to(self.device)
        return model, build_optimizer(self.config.optimizer, model.parameters())

    def _capped_degree(self, graph: Graph) -> torch.Tensor:
        """d̂ = min(degree, D) of the graph a release reads (GCN's coefficients)."""
        return graph.degree.clamp(max=self.fanout) if self.fanout else graph.degree

    # -- releases ----------------------------------------------------------------------------
    def _charged_release(
        self, model: PmpExtractor, roots: torch.Tensor, release: Release, pass_id: str, kind: str, index: int
    ) -> torch.Tensor:
        """The only way A makes a tensor for B: PMP over the roots' subgraphs, then the
        write-ahead charge. The caller sends it only after this returns."""
        roots_on_device = roots.to(self.device)
        sampler, capped_degree = self.sampler, None
        if self.edge_subsampler is not None:
            # this release reads a fresh secret Poisson sample of the edges (party_a.edge_sampling)
            graph = self.edge_subsampler.sample(self.sampling_generator)
            sampler = NeighbourSampler(graph, self.fanout, self.config.extractor.layers)
            capped_degree = self._capped_degree(graph)
        if sampler is None:
            subgraph = edgeless_subgraph(roots_on_device, self.config.extractor.layers)
        else:
            subgraph = sampler.sample(roots_on_device, sampler.layer_seeds(self.sampling_generator))
        embeddings = model(subgraph, self.data.features, release.noise_std, self.noise_generator, capped_degree)
        receipt = self.accountant.charge(
            self.run_id, f"{pass_id}/{index}", pass_id, kind, roots.numel(), nodes_digest(roots),
            release.event_json(kind),
        )
        self.epsilon_spent = receipt.epsilon_spent
        return embeddings

    def _train(self, plan: ReleasePlan, release: Release, model: PmpExtractor, optimizer: torch.optim.Optimizer) -> None:
        cfg = self.config
        root_order = torch.Generator().manual_seed(cfg.seed)
        total = plan.steps_per_epoch * cfg.epochs
        shape_tail = (cfg.extractor.dim, cfg.extractor.layers)
        stream = self.label_party.training()
        try:
            model.train()
            for epoch in range(cfg.epochs):
                order = plan.train_ids[torch.randperm(plan.train_ids.numel(), generator=root_order)]
                for index, batch in enumerate(order.split(cfg.batch_size)):
                    if self.cancelled():
                        raise Cancelled()
                    embeddings = self._charged_release(model, batch, release, f"train-{epoch}", "train", index)
                    reply = stream.exchange(lp_pb.TrainStep(
                        run_id=self.run_id, step=self.steps_done, node_ids=batch.tolist(),
                        embeddings=encode_tensor(embeddings, cfg.wire_dtype),
                    ))
                    gradient = self._check_reply(reply, (batch.numel(), *shape_tail))
                    optimizer.zero_grad(set_to_none=True)
                    embeddings.backward(gradient.to(self.device))
                    optimizer.step()
                    self.steps_done += 1
                    self.report(ProgressEvent(
                        "train", epoch + 1, cfg.epochs, self.steps_done, total, reply.loss, self.epsilon_spent
                    ))
        finally:
            stream.close()

    def _check_reply(self, reply: lp_pb.TrainStepReply, shape: tuple[int, ...]) -> torch.Tensor:
        if reply.run_id != self.run_id or reply.step != self.steps_done:
            raise PeerError(
                f"party B answered run {reply.run_id!r} step {reply.step} to run {self.run_id!r} step {self.steps_done}"
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
    def _evaluate(self, plan: ReleasePlan, release: Release, model: PmpExtractor) -> dict[str, Metric]:
        cfg = self.config
        model.eval()
        stream = self.label_party.evaluation()
        try:
            index = 0
            for split, ids in (("val", plan.val_ids), ("test", plan.test_ids)):
                for chunk in ids.split(cfg.eval_chunk):
                    if self.cancelled():
                        raise Cancelled()
                    self.report(ProgressEvent("eval", message=f"evaluating {split}", epsilon_spent=self.epsilon_spent))
                    embeddings = self._charged_release(model, chunk, release, "eval-0", "eval", index)
                    index += 1
                    stream.send(lp_pb.EvalChunk(
                        run_id=self.run_id, eval_id=0, split=split, node_ids=chunk.tolist(),
                        embeddings=encode_tensor(embeddings, cfg.wire_dtype),
                    ))
            result = stream.result()
        except BaseException:
            stream.cancel()
            raise
        return {m.split: Metric(name=m.name, value=m.value) for m in result.metrics}

    # -- records -------------------------------------------------------------------------------
    def _run_dir(self) -> Path:
        path = self.settings.workdir / "runs" / self.run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _save(self, model: PmpExtractor, optimizer: torch.optim.Optimizer) -> None:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "config": self.config.model_dump(mode="json")},
            self._run_dir() / "extractor.pt",
        )

    def _write_summary(self, summary: RunSummary) -> None:
        (self._run_dir() / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
