"""Party A's dropout: each node's mask a keyed hash of (the release's secret key, node, unit).

Dropout in a pass over the graph is randomness read once per node the pass touches. Drawn
from a stream, how many masks are drawn and which node gets which depends on the step's
sampled subgraph, hence on the edges; drawn from a stream B can reproduce (seeded from the
run's public seed, as ``nn.Dropout`` under ``manual_seed(run.seed)`` would be), a root's
un-noised self path then carries information about edges that no mechanism charged
(docs/privacy.md, section 2.3).

Here the mask of node v's unit j in one release is

    keep(v, j) = [ hash(k_r, v, j) ≥ p · 2³² ],   k_r = two 32-bit words from A's secret
                                                  sampling generator, drawn once per release

(``party_a.sampler.pair_keys``, the sampler's own keyed hash). It depends on the release's
key, the node and the unit only: the same on neighbouring graphs, whatever else the pass
reads, and unknown to B, who never sees k_r. One key per release is drawn whatever the
graph, so the secret generator is consumed in an order that does not depend on the edges
either, and a run repeats exactly under ``party_a.secret_seed``. A node reached twice in
one release (a root that is also a neighbour) gets the same mask both times.

In training mode the module refuses to run without a key, so an extractor cannot fall back
to a stream by accident; in evaluation mode, or with p = 0, it is the identity.
"""

from __future__ import annotations

import torch
from torch import nn

from vesper.party_a.sampler import pair_key_grid, pair_keys

DropoutKey = tuple[int, int]


def draw_dropout_key(generator: torch.Generator) -> DropoutKey:
    """k_r: one release's dropout key, two 32-bit words from A's secret (CPU) generator."""
    first, second = torch.randint(0, 1 << 32, (2,), generator=generator, dtype=torch.int64).tolist()
    return int(first), int(second)


def counter_key(secret: DropoutKey, release: int) -> DropoutKey:
    """k_r of release number ``release`` of a stream keyed by ``secret``: two keyed 32-bit hashes
    of (r, 0) and (r, 1) (``pair_keys``). The edge-free layers' keys (party_a.extractors.pmp_plugin,
    ``MlpPlugin``): the r-th release's key depends on the secret and r alone, whatever else the
    run draws, so the MLP run alone and an extractor's edge-free path draw the same keys."""
    r = torch.tensor([release, release], dtype=torch.int64)
    first, second = pair_keys(secret, r, torch.tensor([0, 1], dtype=torch.int64)).tolist()
    return int(first), int(second)


def keep_mask(key: DropoutKey, nodes: torch.Tensor, units: int, p: float) -> torch.Tensor:
    """keep(v, j) for every node of ``nodes`` and unit j < ``units``: bool [len(nodes), units].

    The hashes are ``pair_keys``'s bits computed by the int32 grid mixer (``pair_key_grid``,
    several times faster on a grid); the unsigned comparison hash ≥ p · 2³² is done on the
    int32 patterns with their sign bit flipped, which orders them as the unsigned values."""
    unit = torch.arange(units, device=nodes.device, dtype=torch.int64)
    hashed = pair_key_grid(key, nodes.to(torch.int64), unit)
    threshold = int(p * float(1 << 32))
    return hashed.bitwise_xor_(-(1 << 31)) >= threshold - (1 << 31)


class KeyedDropout(nn.Module):
    """Inverted dropout (kept units scaled by 1/(1 − p)) with masks keyed by node and release."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(
        self, x: torch.Tensor, nodes: torch.Tensor | None = None, key: DropoutKey | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [len(nodes), units]: row i is about node ``nodes[i]``. ``keep``: the rows'
        ``mask(nodes, key, units)``, computed ahead (party A's prefetch builds it while B computes)."""
        if not self.training or self.p == 0.0:
            return x
        if keep is None:
            if nodes is None or key is None:
                raise ValueError(
                    "party A's dropout in training mode needs the release's secret key and the rows' node ids "
                    "(party_a.keyed_dropout): a mask drawn from a stream would depend on what else the pass reads"
                )
            if nodes.shape != x.shape[:1]:
                raise ValueError(f"{nodes.numel()} node ids for {x.shape[0]} rows")
            keep = keep_mask(key, nodes.to(x.device), x.shape[1], self.p)
        elif keep.shape != x.shape:
            raise ValueError(f"a dropout mask of shape {tuple(keep.shape)} for rows of shape {tuple(x.shape)}")
        return x * keep.to(x.dtype) / (1.0 - self.p)

    def mask(self, nodes: torch.Tensor, key: DropoutKey | None, units: int) -> torch.Tensor | None:
        """The keep mask a call in training mode would apply to rows about ``nodes`` (None: it
        applies none: evaluation mode, p = 0 or no key). It reads no parameter and no feature."""
        if not self.training or self.p == 0.0 or key is None:
            return None
        return keep_mask(key, nodes, units, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
