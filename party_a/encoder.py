"""VESPER's encoder: an MLP from node features to h^(0), reading no edges."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vesper.common.seeded_dropout import SeededDropout


class MlpEncoder(nn.Module):
    """x_v -> h_v^(0) = normalize(relu(MLP(x_v))).

    The output is non-negative with norm ≤ 1 (Algorithm 1, step 4); the sensitivity
    bounds of docs/privacy.md rely on both properties for every layer's input.
    """

    def __init__(self, in_features: int, hidden: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            SeededDropout(dropout),
            nn.Linear(hidden, out_dim),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(F.relu(self.net(features)), dim=-1)
