"""VESPER's encoder: an MLP from node features to h^(0), reading no edges."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vesper.party_a.keyed_dropout import DropoutKey, KeyedDropout


class MlpEncoder(nn.Module):
    """x_v -> h_v^(0) = normalize(relu(MLP(x_v))) [VESPER, Alg. 1, step 4].

    The output is non-negative with norm ≤ 1; the sensitivity bounds of docs/privacy.md rely
    on both properties for every layer's input. In training mode the hidden layer's dropout
    mask of node v is keyed by the release's secret key and v (party_a.keyed_dropout), so
    every call in training mode names the rows' nodes and the release's key.
    """

    def __init__(self, in_features: int, hidden: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            KeyedDropout(dropout),
            nn.Linear(hidden, out_dim),
        )

    def forward(
        self, features: torch.Tensor, nodes: torch.Tensor | None = None, key: DropoutKey | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``features`` [len(nodes), F]: row i holds node ``nodes[i]``'s features; ``keep``:
        their dropout mask, computed ahead by :meth:`dropout_mask` (None: computed here)."""
        first, activation, dropout, last = self.net
        hidden = dropout(activation(first(features)), nodes, key, keep)
        return F.normalize(F.relu(last(hidden)), dim=-1)

    def dropout_mask(self, nodes: torch.Tensor, key: DropoutKey | None) -> torch.Tensor | None:
        """The hidden layer's keep mask for rows about ``nodes`` (KeyedDropout.mask): no
        parameter and no feature, so it can be built before the parameters it meets are known."""
        first, _, dropout, _ = self.net
        return dropout.mask(nodes, key, first.out_features)


class GivenEncoding(nn.Module):
    """h^(0) = the rows given, for measurements and tests that feed a PMP extractor its
    layer-0 inputs directly; the same call as :class:`MlpEncoder`."""

    def forward(
        self, features: torch.Tensor, nodes: torch.Tensor | None = None, key: DropoutKey | None = None,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return features

    def dropout_mask(self, nodes: torch.Tensor, key: DropoutKey | None) -> torch.Tensor | None:
        return None
