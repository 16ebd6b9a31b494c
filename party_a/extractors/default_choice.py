"""The extractor a run trains when it names none (docs/utility.md, section 10).

GAP [GAP], unless A's operator declared a public bound on A's edges (``privacy.edge_bound``)
under which the graph is dense: then ProGAP [ProGAP]. On the six development graphs at
ε ∈ {1, 4, 8, ∞} (docs/utility.md, section 7's table), ProGAP's progressive stages are level
with or above GAP at every ε on the three graphs of mean degree 40 or more (at ε = 4: Tolokers,
mean degree 88, +0.027 ROC-AUC; the dense and heterophilous synthetic graphs +0.005 and
+0.007), level with it at mean degree 2.2 and 9.9 for ε ≤ 8, and below it on Cora (3.9) at
every ε ≤ 8 (−0.019 accuracy at ε = 4): each stage aggregates a hop whose signal grows with a
node's degree while its noise (σ = z·√2 per coordinate) does not. The line is drawn between
9.9 and 40:

    declared mean degree  2 · edge_bound / N  ≥  DENSE_MEAN_DEGREE  →  progap

The choice reads only what is public: the operator's declared bound and the number of nodes
(the id space B aligns against), never a count of A's edges, so it costs no privacy and
tells B nothing about A's graph beyond what the operator declared. A bound far above the
true count can make a sparse graph look dense; the run is then ProGAP's, which is sound and,
through its edge-free path, never below the MLP (section 7) — only possibly below GAP.
"""

from __future__ import annotations

from vesper.common.config import ExtractorConfig, RunConfig
from vesper.common.dotted_settings import is_set
from vesper.party_a.extractors.registry import lookup

DEFAULT = ExtractorConfig.model_fields["name"].default  # gap
DENSE = "progap"
DENSE_MEAN_DEGREE = 20.0


def declared_mean_degree(edge_bound: int, num_nodes: int) -> float:
    """2 · edge_bound / N: the mean degree the declared bound allows (an upper bound on the true one)."""
    return 2.0 * edge_bound / max(num_nodes, 1)


def with_default_extractor(config: RunConfig, num_nodes: int) -> tuple[RunConfig, str]:
    """``config`` with the extractor this module's rule chooses where the run named none, and a
    sentence for the run's progress saying why ("" where the run named one, or nothing changes).

    A run under an accounting ProGAP does not support (it declares ``visible-batch`` only) keeps GAP."""
    if is_set(config, "extractor.name"):
        return config, ""
    bound = config.privacy.edge_bound
    if bound is None or config.privacy.accounting not in lookup(DENSE).spec.accountings:
        return config, ""
    degree = declared_mean_degree(bound, num_nodes)
    if degree < DENSE_MEAN_DEGREE:
        return config, ""
    extractor = config.extractor.model_copy(update={"name": DENSE})
    chosen = config.model_copy(update={"extractor": extractor})
    return chosen, (
        f"no extractor named: {DENSE}, since the declared edge bound ({bound:,} edges over {num_nodes:,} nodes) "
        f"allows a mean degree of {degree:.1f}, at least {DENSE_MEAN_DEGREE:g}: on every development graph that dense "
        f"{DENSE} was level with or above {DEFAULT} (docs/utility.md, section 10); name --extractor to choose another"
    )
