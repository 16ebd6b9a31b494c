"""Party A on W worker processes (``party_a.workers = W``): data parallel with torch.distributed.

Rank 0 is the service's run thread (``party_a.run``); ranks 1..W-1 are worker processes it
starts on this host (``party_a.workers.group.WorkerGroup``), or that an operator starts on
other hosts with the usual rendezvous settings (``python -m vesper.party_a.workers``,
docs/deployment.md). Per release, rank 0 broadcasts the roots' shares and the state of A's
secret generators (and the parameters, when they changed); every rank releases its share
(sample, encode, perturb: PMP's noise and dropout are keyed per node, so a node two ranks
reach gets one value, docs/privacy.md 2.6); rank 0 gathers the rows in root order, charges
the release once and sends it to B. B's gradient rows go back to their ranks; the parameter
gradients are summed into rank 0's, which steps the optimiser.

GAP's one-shot hops (``gap``, ``relational-gap``; ``party_a.workers.hops``): per hop, rank 0
broadcasts x̃_{k-1} and the hop's noise key; every rank computes its contiguous block of rows of
A x̃_{k-1} from the memory-mapped CSR, plus their keyed noise (each row noised once, by its
block's rank); rank 0 gathers x_k and charges the hop once, before anything reads it. The
workers start when the hops begin and stop when they end: GAP's edge-free encoder stage,
relational-gap's DP-SGD pre-training and the training steps (rows of the cached hops) run on
rank 0 alone.

Scope: the per-step PMP extractors (``mlp``, ``pmp-gin``, ``pmp-gcn``) and GAP's hops. Any other
extractor (``dpar-edge``, ``dpar-node``, ``vfgnn``, ``heterpoisson``, ``relational``), an audit
that rebuilds the graph (canaries, membership), or label privacy ``pate`` with W > 1 is refused
at the run's start, before anything is charged (:class:`WorkersUnsupported`), and so is a second
run while one holds the group (:class:`GroupReservation`).
"""

from vesper.party_a.workers.errors import WorkerLost, WorkersUnsupported
from vesper.party_a.workers.group import DistributedExtractor, GroupReservation, WorkerGroup, check_supported

__all__ = [
    "DistributedExtractor", "GroupReservation", "WorkerGroup", "WorkerLost", "WorkersUnsupported", "check_supported",
]
