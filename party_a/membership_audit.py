"""TFTS, the membership audit's set-up at party A ([VESPER, App. C.7]; docs/audit-canaries.md §7).

With ``audit.membership`` A trains its extractor on the subgraph induced by B's training
nodes and evaluates on the full graph, so B's posteriors tell members from non-members
only by what training saw. These checks keep the run's one charge plan true for both.
"""

from __future__ import annotations

from torch import nn

from vesper.common.config import RunConfig
from vesper.party_a.extractors.base import ChargePlan, Extractor, RootPlan


def check_tfts(config: RunConfig, extractor: Extractor) -> None:
    """Refuse, before anything is charged, a TFTS run whose plan would not cover its releases."""
    name = config.extractor.name
    if extractor.spec.cost_model not in ("per-step", "none"):
        raise ValueError(
            f"audit.membership (TFTS) needs a per-step extractor: {name}'s {extractor.spec.cost_model} releases "
            "are computed once, on the training subgraph, and would have to be released again on the full "
            "graph for the evaluation pass, a second charge the run's plan does not contain"
        )
    if config.label_privacy.mode == "pate":
        raise ValueError("audit.membership (TFTS) cannot be combined with label_privacy.mode=pate")
    if not isinstance(extractor, nn.Module):
        raise ValueError(f"audit.membership (TFTS) copies the trained {name} to the full graph: it must be an nn.Module")


def tfts_chunk(roots: RootPlan, eval_chunk: int) -> int:
    """Chunk size of the training nodes in a TFTS evaluation pass: no larger than a val/test
    chunk, since a plan may size its evaluation sensitivity by those (VFGNN's V7)."""
    return max(1, min(eval_chunk, max(roots.val_ids.numel(), roots.test_ids.numel())))


def same_charges(training: ChargePlan, evaluation: ChargePlan, name: str) -> None:
    """The extractor on the full graph must be charged as the plan (made on the subgraph) says."""
    fields = ("rules", "sensitivity", "one_shot_releases", "pre_train_releases", "stages", "participation_bound")
    differ = [f for f in fields if getattr(training, f) != getattr(evaluation, f)]
    if differ:
        raise ValueError(
            f"audit.membership (TFTS): {name}'s charge plan depends on the graph it reads ({', '.join(differ)} "
            "differ between the training subgraph and the full graph), so one plan cannot cover both"
        )
