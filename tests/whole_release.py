"""Whole-release neighbouring runs: what party A sends B on G and on a neighbouring graph G'.

The empirical sensitivity tests check the part of a release that passes through the noise.
This harness checks the *whole* release (privacy contract, "Every extractor must", 3): it
drives an extractor through the interface the trainer uses (charge_plan, bind, prepare with
its charges, progress lines and edge-free stages, training steps with B's gradient and A's
update, an evaluation pass), on G and on G', with the same public inputs and the same
secret seeds, and compares everything that would reach B:

* the plan (its rules and details go into the run record anyone can read), the charges made
  in ``prepare`` (their node ids reach the ledger) and every progress line;
* every release as wire bytes (``common.wire.encode_tensor``).

Every mechanism call goes through the extractor's ``NoiseSource`` (party_a.noise). On G the
harness records each call's input and output; on G' it substitutes the recorded outputs for
the rows about the same nodes (the coupling under which the two runs' mechanisms agree).
What is left must be identical: any difference is a channel from the edges to B that no
mechanism covers (a dropout mask drawn in an edge-dependent order from a stream B knows, an
un-noised neighbour read, a gradient that crossed an edge into A's parameters, a count in a
progress line, an edge-dependent number of noise draws). For edge-level extractors whose
rules are Gaussian, the inputs of the mechanism calls (rows about the same node) must also
differ by no more than the charged events allow, in units of each call's noise:
Σ_calls ‖Δ input‖² / σ_call² ≤ Σ_counted releases 1/z_release² (docs/privacy.md, section 2.3).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import dp_accounting as dpa
import torch
import torch.nn.functional as F

from vesper.common.config import RunConfig
from vesper.common.optim import build_optimizer
from vesper.common.privacy.ledger import PlanRule
from vesper.common.wire import encode_tensor
from vesper.party_a.extractors.base import Extractor, ExtractorSetup, RootPlan, Stage, shuffled_batches
from vesper.party_a.extractors.edge_free_path import build_extractor
from vesper.party_a.extractors.registry import validated_params
from vesper.party_a.graph_store import Graph, build_graph
from vesper.party_a.noise import NoiseSource

Z = 1.0  # the noise multiplier of every run here
SAMPLING_SEED, NOISE_SEED = 11, 13  # A's secret seeds: the same in both worlds
_DURATION = re.compile(r"\b\d+(\.\d+)? s\b")  # a wall-clock duration in a progress line
TRAIN_STEPS = 2  # training steps after the preparation (the second reads A's first update)
STAGE_STEPS = 2  # steps of each edge-free stage
SLACK = 1e-4  # relative, on the whitened sensitivity check (float32 sums)


# -- the neighbouring pair ------------------------------------------------------------------------
@dataclass(frozen=True)
class World:
    """One side of a neighbouring pair: A's graph and features."""

    graph: Graph
    features: torch.Tensor


def graph_of(edges: list[tuple[int, int]], num_nodes: int) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), num_nodes)


def base_edges(num_nodes: int, seed: int) -> list[tuple[int, int]]:
    """A small graph with a hub (node 0), a sparse rest and a few isolated nodes (the last 4)."""
    rng = random.Random(seed)
    connected = num_nodes - 4
    edges = {(0, j) for j in range(1, connected) if rng.random() < 0.5}
    for i in range(1, connected):
        for j in range(i + 1, connected):
            if rng.random() < 0.08:
                edges.add((i, j))
    return sorted(edges)


def features_of(num_nodes: int, width: int, seed: int) -> torch.Tensor:
    return torch.rand(num_nodes, width, generator=torch.Generator().manual_seed(seed))


def edge_pair(edges: list[tuple[int, int]], extra: tuple[int, int], num_nodes: int, features: torch.Tensor) -> tuple[World, World]:
    """(G, G'): G holds ``extra``, G' does not (add/remove one undirected edge)."""
    u, v = sorted(extra)
    without = [e for e in edges if e != (u, v)]
    return World(graph_of(without + [(u, v)], num_nodes), features), World(graph_of(without, num_nodes), features)


def null_pair(edges: list[tuple[int, int]], node: int, num_nodes: int, features: torch.Tensor) -> tuple[World, World]:
    """(G, G'): in G' node ``node`` is replaced by a null node (no edges, zero features, same id)."""
    nulled = features.clone()
    nulled[node] = 0.0
    kept = [e for e in edges if node not in e]
    return World(graph_of(edges, num_nodes), features), World(graph_of(kept, num_nodes), nulled)


# -- the mechanism calls ----------------------------------------------------------------------------
@dataclass
class MechanismCall:
    kind: str  # gaussian or gumbel
    scale: float  # σ or the Gumbel scale b
    rows: torch.Tensor | None  # the node id of each row (None: the tensor as a whole)
    before: torch.Tensor  # the mechanism's input
    after: torch.Tensor  # what it returned


class RecordingNoise(NoiseSource):
    """A's NoiseSource that records every call; given G's calls, it substitutes their outputs."""

    def __init__(
        self, generator: torch.Generator, reference: list[MechanismCall] | None = None, keyed: bool = False,
    ) -> None:
        super().__init__(generator, keyed=keyed)
        self.reference = reference
        self.calls: list[MechanismCall] = []
        self.problems: list[str] = []

    def gaussian(
        self, values: torch.Tensor, std: float, *, rows: torch.Tensor | None = None, key=None, layer: int = 0,
        drawn: torch.Tensor | None = None,
    ) -> torch.Tensor:
        keyed = partial(super().gaussian, key=key, layer=layer, drawn=drawn)
        return self._perturb("gaussian", values, std, rows, keyed)

    def gumbel(self, values: torch.Tensor, scale: float, *, rows: torch.Tensor | None = None) -> torch.Tensor:
        return self._perturb("gumbel", values, scale, rows, super().gumbel)

    def _perturb(
        self, kind: str, values: torch.Tensor, scale: float, rows: torch.Tensor | None,
        draw: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        before = values.detach().clone()
        out = draw(values, scale, rows=rows)
        if self.reference is not None:
            out = self._substitute(kind, scale, rows, out)
        self.calls.append(MechanismCall(
            kind, scale, None if rows is None else rows.detach().cpu().clone(), before, out.detach().clone(),
        ))
        return out

    def _substitute(self, kind: str, scale: float, rows: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        index = len(self.calls)
        if index >= len(self.reference):
            self.problems.append(f"mechanism call {index} ({kind}) has no counterpart on G: the number of calls depends on the edges")
            return out
        ref = self.reference[index]
        if (ref.kind, ref.scale) != (kind, scale):
            self.problems.append(f"mechanism call {index}: {kind}({scale:g}) on G' against {ref.kind}({ref.scale:g}) on G")
            return out
        if (rows is None) != (ref.rows is None) or ref.after.shape[1:] != out.shape[1:]:
            self.problems.append(f"mechanism call {index}: its shape or row labels differ between G and G'")
            return out
        replaced = out.detach().clone()
        if rows is None:
            if ref.after.shape != out.shape:
                self.problems.append(f"mechanism call {index}: shape {tuple(out.shape)} on G' against {tuple(ref.after.shape)} on G")
                return out
            replaced = ref.after.to(out.dtype)
        else:
            position = {int(node): j for j, node in enumerate(ref.rows.tolist())}
            mine = [j for j, node in enumerate(rows.tolist()) if int(node) in position]
            if mine:
                theirs = [position[int(rows[j])] for j in mine]
                replaced[torch.tensor(mine)] = ref.after[torch.tensor(theirs)].to(out.dtype)
        if out.requires_grad:
            return out + (replaced - out.detach())
        with torch.no_grad():
            return out.copy_(replaced)


def matched_inputs(a: MechanismCall, b: MechanismCall) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The two calls' inputs, row by row for the nodes both have (float64); None: nothing to compare."""
    if a.before.shape[1:] != b.before.shape[1:]:
        return None
    if a.rows is None or b.rows is None:
        return (a.before.double(), b.before.double()) if a.before.shape == b.before.shape else None
    position = {int(node): j for j, node in enumerate(a.rows.tolist())}
    pairs = [(position[int(node)], j) for j, node in enumerate(b.rows.tolist()) if int(node) in position]
    if not pairs:
        return None
    left, right = torch.tensor([p for p, _ in pairs]), torch.tensor([q for _, q in pairs])
    return a.before[left].double(), b.before[right].double()


def whitened_change(g: list[MechanismCall], g_prime: list[MechanismCall]) -> float:
    """Σ over Gaussian calls of ‖Δ input‖²/σ², rows matched by node id (rows only one side has are
    not compared: the other graph never computed them). Equal entries count 0, infinities
    included (e.g. a score excluded by −∞ on both sides); any other non-finite change is ∞."""
    total = 0.0
    for a, b in zip(g, g_prime, strict=False):
        if a.kind != "gaussian" or a.scale <= 0:
            continue
        inputs = matched_inputs(a, b)
        if inputs is None:
            continue
        x, y = inputs
        delta = torch.where(x == y, torch.zeros_like(x), x - y)
        change = float(delta.pow(2).sum())
        total += math.inf if math.isnan(change) else change / a.scale**2
    return total


def mu_squared(event: dpa.DpEvent) -> float | None:
    """1/z² summed over the Gaussian mechanisms an event composes (no credit for sampling:
    the coupled runs here always hold the same sample); None where the event is not Gaussian."""
    if isinstance(event, dpa.NoOpDpEvent):
        return 0.0
    if isinstance(event, dpa.GaussianDpEvent):
        return 1.0 / event.noise_multiplier**2
    if isinstance(event, dpa.PoissonSampledDpEvent):
        return mu_squared(event.event)
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = mu_squared(event.event)
        return None if inner is None else inner * event.count
    if isinstance(event, dpa.ComposedDpEvent):
        parts = [mu_squared(e) for e in event.events]
        return None if any(p is None for p in parts) else sum(parts)
    return None


# -- one world's run ---------------------------------------------------------------------------------
@dataclass
class Observed:
    """Everything of one run that reaches B, the run record or the coordinator."""

    plan: dict[str, Any]
    charges: list[tuple[str, int, list[int]]] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)
    wires: list[tuple[str, bytes]] = field(default_factory=list)
    releases: dict[str, int] = field(default_factory=dict)  # kind -> releases made, in order of passes
    calls: list[MechanismCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rules: list[PlanRule] = field(default_factory=list)


def fake_gradient(embeddings: torch.Tensor, roots: torch.Tensor, classes: int = 3) -> torch.Tensor:
    """B's gradient dLoss/dH: a fixed linear decoder, labels from the node ids. A function of
    what B received (and of public ids) only, as B's real gradient is."""
    received = embeddings.detach().clone().requires_grad_()
    flat = received.reshape(roots.numel(), -1)
    decoder = torch.randn(flat.shape[1], classes, generator=torch.Generator().manual_seed(flat.shape[1]))
    F.cross_entropy(flat @ decoder, roots.cpu() % classes).backward()
    return received.grad


class RecordingSession:
    """The PrepareSession an extractor gets: charges, progress and edge-free stages are recorded."""

    def __init__(self, roots: RootPlan, config: RunConfig, observed: Observed, send: Callable[..., None]) -> None:
        self.roots = roots
        self.config = config
        self.observed = observed
        self.send = send

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self.observed.charges.append(("one-shot", index, node_ids.tolist()))
        self.observed.releases["one-shot"] = self.observed.releases.get("one-shot", 0) + 1

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        self.observed.charges.append(("pre-train", index, node_ids.tolist()))
        self.observed.releases["pre-train"] = self.observed.releases.get("pre-train", 0) + 1

    def train_stage(self, stage: Stage, release: Callable[[torch.Tensor], torch.Tensor], parameters) -> None:
        params = list(parameters)
        optimizer = build_optimizer(self.config.optimizer, params) if params else None
        order = torch.Generator().manual_seed(self.config.seed)
        batches = shuffled_batches(self.roots.train_ids, self.config.batch_size, order)[:STAGE_STEPS]
        for batch in batches:
            self.send(f"stage {stage.name}", release(batch), batch, optimizer)

    def progress(self, message: str) -> None:
        # a duration ("released in 0.01 s") is the machine's clock, not a function of the graph
        # that DP covers (timing is outside the threat model, docs/privacy.md section 6): compared without it
        self.observed.progress.append(_DURATION.sub("<t> s", message))


EDGE_FREE_KEY = (0x5EC2E7, 0xED6E)  # A's secret of the edge-free layers' dropout keys, the same in every world


def run_world(
    cls: type[Extractor], config: RunConfig, world: World, roots: RootPlan, noise: RecordingNoise,
) -> Observed:
    """Plan, bind, prepare, TRAIN_STEPS training steps and one evaluation pass, as the trainer
    drives an extractor; A's secret seeds are the same in every world."""
    sampling = torch.Generator().manual_seed(SAMPLING_SEED)
    setup = ExtractorSetup(
        config=config, params=validated_params(cls.spec, config), graph=world.graph, features=world.features,
        device=torch.device("cpu"), sampling_generator=sampling, noise_generator=noise.generator,
        delta=config.privacy.delta, noise=noise, edge_free_key=EDGE_FREE_KEY,  # the edge-free layers' own stream
    )
    extractor = build_extractor(cls, setup)  # as the trainer builds it: with the edge-free path
    plan = extractor.charge_plan(roots)
    observed = Observed(plan={
        "rules": [rule.model_dump(mode="json") for rule in plan.rules],
        "details": json.loads(json.dumps(plan.details, sort_keys=True, default=repr)),
        "sensitivity": plan.sensitivity, "one_shot_releases": plan.one_shot_releases,
        "pre_train_releases": plan.pre_train_releases, "participation_bound": plan.participation_bound,
        "stages": [(s.name, s.epochs, s.layers) for s in plan.stages], "output_layers": extractor.output_layers,
    }, rules=list(plan.rules))
    extractor.bind(Z)

    def send(label: str, embeddings: torch.Tensor, batch: torch.Tensor, optimizer) -> None:
        message = encode_tensor(embeddings, config.wire_dtype)
        observed.wires.append((label, message.SerializeToString(deterministic=True)))
        if optimizer is not None and embeddings.requires_grad:
            optimizer.zero_grad(set_to_none=True)
            embeddings.backward(fake_gradient(embeddings, batch))
            optimizer.step()

    extractor.prepare(RecordingSession(roots, config, observed, send))
    parameters = extractor.trainable_parameters()
    optimizer = build_optimizer(config.optimizer, parameters) if parameters else None
    extractor.train()
    order = torch.Generator().manual_seed(config.seed)
    for batch in [b for b in extractor.root_batches(roots.train_ids, config.batch_size, order) if b.numel()][:TRAIN_STEPS]:
        send("train", extractor.release(batch, "train"), batch, optimizer)
        observed.releases["train"] = observed.releases.get("train", 0) + 1
    extractor.train(False)
    with torch.no_grad():
        for ids in (roots.val_ids, roots.test_ids):
            for chunk in ids.split(config.eval_chunk):
                send("eval", extractor.release(chunk, "eval"), chunk, None)
                observed.releases["eval"] = observed.releases.get("eval", 0) + 1
    observed.calls = noise.calls
    observed.problems = list(noise.problems)
    return observed


# -- the comparison ---------------------------------------------------------------------------------
def charged_mu_squared(observed: Observed) -> float | None:
    """What the rules charge for the releases made: per kind, the first ``participation_bound``
    releases of its pass count (None: all), each the rule's event at z = Z."""
    total = 0.0
    for rule in observed.rules:
        made = observed.releases.get(rule.kind, 0)
        counted = made if rule.participation_bound is None else min(made, rule.participation_bound)
        if rule.mechanism == "no-op" or counted == 0:
            continue
        mu = mu_squared(rule.event(Z))
        if mu is None:
            return None
        total += counted * mu
    return total


def differences(g: Observed, g_prime: Observed, *, check_sensitivity: bool) -> list[str]:
    """Everything that tells G from G' outside the mechanisms' coupled outputs."""
    found = list(g_prime.problems)
    if g.plan != g_prime.plan:
        keys = sorted(k for k in g.plan if g.plan[k] != g_prime.plan.get(k))
        detail = {k: (g.plan[k], g_prime.plan.get(k)) for k in keys}
        if "details" in keys:
            a, b = g.plan["details"], g_prime.plan["details"]
            detail["details"] = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        found.append(f"the plan (run record) differs: {detail}")
    if g.charges != g_prime.charges:
        found.append("the charges made while preparing differ")
    if g.progress != g_prime.progress:
        pairs = [(a, b) for a, b in zip(g.progress, g_prime.progress, strict=False) if a != b]
        found.append(f"progress lines differ: {pairs[:2] or (len(g.progress), len(g_prime.progress))}")
    if [label for label, _ in g.wires] != [label for label, _ in g_prime.wires]:
        found.append("the sequence of releases differs")
    else:
        for i, ((label, a), (_, b)) in enumerate(zip(g.wires, g_prime.wires, strict=True)):
            if a != b:
                found.append(f"release {i} ({label}) differs outside the mechanisms' outputs")
                break
    if len(g.calls) != len(g_prime.calls):
        found.append(f"{len(g.calls)} mechanism calls on G, {len(g_prime.calls)} on G'")
    if check_sensitivity:
        charged = charged_mu_squared(g)
        if charged is not None:
            observed = whitened_change(g.calls, g_prime.calls)
            if observed > charged * (1 + SLACK) + 1e-9:
                found.append(
                    f"the mechanisms' inputs moved by Σ‖Δ‖²/σ² = {observed:.4g}, above the {charged:.4g} the "
                    "charged events cover"
                )
    return found


def neighbouring_runs(
    cls: type[Extractor], config: RunConfig, pair: tuple[World, World], roots: RootPlan, keyed: bool = False,
) -> tuple[Observed, Observed]:
    """The run on G (recording) and on G' (the same secret seeds, G's mechanism outputs substituted);
    ``keyed``: per-node noise keyed as party A's workers draw it (docs/privacy.md 2.6)."""
    on_g = run_world(cls, config, pair[0], roots, RecordingNoise(torch.Generator().manual_seed(NOISE_SEED), keyed=keyed))
    on_g_prime = run_world(
        cls, config, pair[1], roots,
        RecordingNoise(torch.Generator().manual_seed(NOISE_SEED), reference=on_g.calls, keyed=keyed),
    )
    return on_g, on_g_prime

