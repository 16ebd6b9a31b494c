"""``vesper bench snr``: how much neighbourhood signal survives the noise, per degree.

For each extractor, the noise multiplier z is calibrated exactly as the accountant
would for the run's plan (the same charge rules, counted releases and accountant), so
the per-coordinate noise std is θ = z · S (S: the plan's sensitivity). The signal is
the norm of the first quantity that gets that noise, for every node, computed from a
freshly initialised encoder (unit-norm, non-negative rows, as [VESPER, Alg. 1, step 4]
guarantees): a sum over the neighbours the extractor reads (PMP-GIN, GAP's first hop)
or the truncated GCN sum (PMP-GCN). Noise of std θ in d dimensions has norm ≈ θ√d, so a
node's aggregate is readable only where ‖a_v‖ / (θ√d) approaches 1. Nothing here is
released or charged: it runs locally, on data the operator already has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.accountant.budget import Accountant, AccountantError
from vesper.common.config import RunConfig
from vesper.common.dataset_files import load_label_part
from vesper.common.splits import split_for
from vesper.party_a.extractors.base import ChargePlan, ExtractorSetup, RootPlan
from vesper.party_a.extractors.pmp import gcn_aggregate, gin_aggregate
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.run import GraphData
from vesper.party_a.sampler import NeighbourSampler, draw_order_key

BUCKETS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 10**9))

# What each extractor noises first: (aggregation, reads every neighbour?)
AGGREGATES = {"pmp-gin": ("sum", False), "pmp-gcn": ("gcn", False), "gap": ("sum", True), "vfgnn": ("sum", False)}


@dataclass(frozen=True)
class Bucket:
    low: int
    high: int
    nodes: int
    signal: float  # mean ‖a_v‖
    noise: float  # θ √d
    readable: float  # share of nodes with ‖a_v‖ > θ √d


@dataclass(frozen=True)
class Profile:
    extractor: str
    noise_multiplier: float
    noise_std: float
    dim: int
    buckets: list[Bucket]


def roots_of(config: RunConfig, dataset: Path) -> RootPlan:
    split = split_for(load_label_part(dataset), config.split_seed)
    train, val, test = (torch.from_numpy(part) for part in (split.train, split.val, split.test))
    chunks = math.ceil(val.numel() / config.eval_chunk) + math.ceil(test.numel() / config.eval_chunk)
    return RootPlan(train, val, test, math.ceil(train.numel() / config.batch_size), chunks)


def noise_multiplier(plan: ChargePlan, roots: RootPlan, config: RunConfig, delta: float) -> float:
    """z the accountant calibrates for this plan: its own calibration, called without a ledger."""
    privacy = config.privacy
    try:
        z, _, _, _ = Accountant.calibrate_gaussian(
            plan.passes(config.epochs, roots), plan.rules, privacy.epsilon, delta, privacy.accounting, privacy.accountant,
        )
    except AccountantError as exc:
        raise ValueError(str(exc)) from None
    return z


def signal_norms(data: GraphData, config: RunConfig, aggregation: str, whole: bool) -> torch.Tensor:
    """‖a_v‖ for every node, from unit-norm non-negative encodings of a fresh encoder."""
    from vesper.party_a.encoder import MlpEncoder

    ex = config.extractor
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(config.seed)
        encoder = MlpEncoder(data.features.shape[1], ex.encoder_hidden, ex.dim, ex.dropout).eval()
        h = encoder(data.features)
        fanout = 0 if whole else ex.fanout
        secret = torch.Generator().manual_seed(config.seed)  # the measurement's stand-in for A's secret generator
        sampler = NeighbourSampler(data.graph, fanout, 1, draw_order_key(secret, fanout))
        nodes = torch.arange(data.graph.num_nodes)
        block = sampler.sample(nodes, sampler.layer_seeds(secret)).blocks[0]
        h_src = h[block.src_nodes]
        if aggregation == "gcn":
            capped = data.graph.degree.clamp(max=fanout) if fanout else data.graph.degree
            aggregate = gcn_aggregate(block, h_src, capped, ex.d_min)
        else:
            aggregate = gin_aggregate(block, h_src)
    return aggregate.norm(dim=1)


def profile(config: RunConfig, dataset: Path, extractor: str) -> Profile:
    data = GraphData.load(dataset, torch.device("cpu"))
    run = config.model_copy(update={"extractor": config.extractor.model_copy(update={"name": extractor, "params": {}})})
    delta = run.privacy.delta
    cls = lookup(extractor)
    setup = ExtractorSetup(
        config=run, params=validated_params(cls.spec, run), graph=data.graph, features=data.features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2), delta=delta,
    )
    roots = roots_of(run, dataset)
    plan = cls(setup).charge_plan(roots)
    z = noise_multiplier(plan, roots, run, delta)
    theta = z * plan.sensitivity
    aggregation, whole = AGGREGATES[extractor]
    signal = signal_norms(data, run, aggregation, whole)
    noise = theta * math.sqrt(run.extractor.dim)
    degree = data.graph.degree
    buckets = []
    for low, high in BUCKETS:
        members = (degree >= low) & (degree <= high)
        count = int(members.sum())
        if count:
            values = signal[members]
            buckets.append(Bucket(low, high, count, float(values.mean()), noise, float((values > noise).float().mean())))
    return Profile(extractor, z, theta, run.extractor.dim, buckets)
