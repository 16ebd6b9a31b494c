"""White-box canary scores: the auditor replays A's trained extractor with and without each canary.

B's own score (auditor.edge_inference.pair_scores: how alike two nodes' releases are) barely
sees a canary even without noise: a canary joins two random nodes, so there is no homophily
to find, and PMP mixes the neighbour in through W_agg, a different map from the node's own
W_self (docs/audit-canaries.md, section 5). The one-run theorem allows any guess that does
not look at the coins S, so the auditor may use everything else: A's graph without the
canaries (the dataset file), A's features and A's trained extractor (``extractor.pt``; A's
parameters are post-processing of charged releases, docs/privacy.md section 2.2). For
every canary (u, v) it computes the noiseless evaluation release of u and v on the graph
without and with the pair and scores

    score = Σ_{x ∈ {u, v}, released in the evaluation pass}  ‖y_x − h_x^out‖² − ‖y_x − h_x^in‖²,

the log-likelihood ratio of "inserted" for a Gaussian release y_x = h_x + noise (exact when
the noise is added to the output; vesper's PMP adds it before W_agg, so it is an
approximation, which can only weaken the attack, never the validity of the bound).

Only extractors that compute their releases from the graph at release time (cost model
``per-step`` or ``none``) can be replayed; GAP's and DPAR's rows were fixed by a one-shot
release inside A and would need their own replay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vesper.auditor.one_run_bound import OneRunAudit, canary_audit
from vesper.auditor.received_releases import ReceivedReleases
from vesper.common.config import RunConfig
from vesper.party_a.canaries import CanaryDraw
from vesper.party_a.extractors.base import Extractor, ExtractorSetup
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.graph_store import Graph, build_graph

REPLAYABLE = ("per-step", "none")
REPLAY_SCORER = "white-box: A's trained extractor replayed without and with each canary"


def _trained_extractor(state: dict, graph: Graph, features: torch.Tensor) -> Extractor:
    """A's extractor with its trained parameters on ``graph``, noise off, in evaluation mode."""
    config = RunConfig.model_validate(state["config"])
    cls = lookup(config.extractor.name)
    if cls.spec.cost_model not in REPLAYABLE:
        raise ValueError(
            f"{config.extractor.name} ({cls.spec.cost_model}) cannot be replayed: its releases were fixed by a "
            "one-shot release inside party A"
        )
    # fixed public seeds: the replay is the auditor's, A's secret sampling seeds are not needed
    setup = ExtractorSetup(
        config=config, params=validated_params(cls.spec, config), graph=graph, features=features,
        device=features.device, sampling_generator=torch.Generator().manual_seed(0),
        noise_generator=torch.Generator(device=features.device).manual_seed(0), delta=1.0,
    )
    extractor = cls(setup)
    extractor.bind(None)
    extractor.load_state_dict(state["extractor"])  # after bind: bind may reset a trained gain
    extractor.train(False)
    return extractor


@torch.no_grad()
def _noiseless_release(extractor: Extractor, nodes: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    return torch.cat([extractor.release(part, "eval").detach().float().cpu() for part in nodes.split(chunk)])


def replay_scores(
    draw: CanaryDraw, received: ReceivedReleases, state: dict, edges: np.ndarray, features: np.ndarray
) -> np.ndarray:
    """The white-box score of every canary (higher = more likely inserted); NaN where B has
    no evaluation release of either endpoint.

    ``state``: A's ``extractor.pt`` (trained parameters and the run's config); ``edges`` and
    ``features``: A's graph *without* canaries and A's features (the dataset file).
    The candidates are disjoint, so adding all of them at once gives each endpoint its own
    canary and no other; for L ≥ 2 or a GCN sender's degree a neighbouring canary can
    still move a release slightly, which only adds noise to the score.
    """
    num_nodes = received.num_nodes
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    without = build_graph(edges, num_nodes)
    with_all = build_graph(np.concatenate([np.asarray(edges, dtype=np.int64).reshape(-1, 2), draw.pairs]), num_nodes)
    endpoints = np.unique(draw.pairs.reshape(-1))
    endpoints = endpoints[received.eval_seen[endpoints]]
    if not endpoints.size:
        raise ValueError(
            "no canary endpoint was released in the evaluation pass (the canaries are training roots): "
            "the per-release statistics (party_a.canary_statistics) score them"
        )
    nodes = torch.from_numpy(endpoints)
    h_out = _noiseless_release(_trained_extractor(state, without, x), nodes).numpy().reshape(len(endpoints), -1)
    h_in = _noiseless_release(_trained_extractor(state, with_all, x), nodes).numpy().reshape(len(endpoints), -1)
    y = received.eval_embedding[endpoints].reshape(len(endpoints), -1)
    per_node = np.full(num_nodes, np.nan)
    per_node[endpoints] = np.sum((y - h_out) ** 2, axis=1) - np.sum((y - h_in) ** 2, axis=1)
    u, v = per_node[draw.pairs[:, 0]], per_node[draw.pairs[:, 1]]
    both_missing = np.isnan(u) & np.isnan(v)
    return np.where(both_missing, np.nan, np.nan_to_num(u) + np.nan_to_num(v))


def load_state(run_dir: Path) -> dict:
    """A's ``extractor.pt`` of a finished run (the auditor reads A's workdir after the run)."""
    path = run_dir / "extractor.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: party A saves it when a run completes")
    return torch.load(path, map_location="cpu", weights_only=False)


def audit_canaries_replayed(
    draw: CanaryDraw, received: ReceivedReleases, run_dir: Path, edges: np.ndarray, features: np.ndarray,
    delta: float, confidence: float,
) -> OneRunAudit:
    """The one-run audit with the white-box score (:func:`replay_scores`); ``run_dir`` is A's
    run directory, ``edges``/``features`` A's dataset without canaries."""
    scores = replay_scores(draw, received, load_state(run_dir), edges, features)
    return canary_audit(scores, draw.included, delta, confidence, REPLAY_SCORER)
