"""VESPER's decoders (section 2.5): they read party A's B x d x L embeddings at party B."""

from __future__ import annotations

import torch
from torch import nn

from vesper.common.config import DecoderConfig
from vesper.party_b.seeded_dropout import SeededDropout


class ConcatDecoder(nn.Module):
    """CONCAT: the L layer embeddings side by side, then an MLP."""

    def __init__(self, dim: int, layers: int, hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim * layers, hidden), nn.ReLU(), SeededDropout(dropout), nn.Linear(hidden, classes)
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:  # [B, d, L]
        return self.net(embeddings.transpose(1, 2).flatten(1))


class GruDecoder(nn.Module):
    """GRU: the L layer embeddings as a sequence, the last hidden state classified."""

    def __init__(self, dim: int, hidden: int, classes: int, dropout: float) -> None:
        super().__init__()
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.head = nn.Sequential(SeededDropout(dropout), nn.Linear(hidden, classes))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:  # [B, d, L]
        _, last = self.gru(embeddings.transpose(1, 2))
        return self.head(last[-1])


def build_decoder(config: DecoderConfig, dim: int, layers: int, classes: int) -> nn.Module:
    if config.kind == "concat":
        return ConcatDecoder(dim, layers, config.hidden_dim, classes, config.dropout)
    if config.kind == "gru":
        return GruDecoder(dim, config.hidden_dim, classes, config.dropout)
    raise ValueError(f"unknown decoder {config.kind!r}; expected concat or gru")
