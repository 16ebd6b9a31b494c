"""Party A's side of one run: VESPER's algorithm [VESPER, Alg. 3] with write-ahead charging,
for any extractor. One module per job:

    execute        GraphPartyRun: the phases below, in order, as one short method
    set-up         A builds the run's extractor (a plugin, party_a.extractors.registry);
                   B tells A the split (label_session); the extractor states each kind of
                   release's DpEvent as a function of z and the accountant calibrates z (release)
    charger        write-ahead charging: create, reopen, charge, charge ahead, journal, close
    preparation    the extractor's stages before training: edge-free pre-training with B,
                   one-shot releases (GAP's hops, DPAR's neighbourhoods), each charged first
    step_loop      per step: the extractor releases the batch's B x d x L', A charges it,
                   sends it to B, receives dLoss/dH and updates what the extractor trains;
                   while B computes, A samples the next step's subgraph (pipelining: sampling
                   reads no parameter, so the releases are the same; ``pipeline = false`` in
                   [party_a] turns it off)
    evaluation     per chunk of validation/test nodes: release, charge, send; B returns metrics
    checkpoints    the resume record and checkpoints (files: checkpoint_files; docs/faults.md)
    summary        the run's summary, and how each way of stopping ends it
    audit_hooks    canaries, TFTS and gradient recording, plugged in at on_roots/on_step/on_finish

Nothing leaves A before the accountant has committed its charge, and a refused charge ends
the run cleanly without sending. The run's plan (one-shot releases, stages, epochs x steps,
one evaluation sweep) is exactly what is charged, so a calibrated run ends with ε spent =
the calibrated ε ≤ budget.
"""

from vesper.party_a.run.execute import GraphPartyRun
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.run.progress import Cancelled, ProgressEvent

__all__ = ["Cancelled", "GraphData", "GraphPartyRun", "ProgressEvent"]
