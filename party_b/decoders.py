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


# FallbackDecoder's heads, in the order of its ``choice`` and, on a tie, of preference (the simplest first)
HEADS = ("edge-free", "graph", "combined")


class FallbackDecoder(nn.Module):
    """Three heads over a release whose last ``edge_free`` slices read no edge (A's edge-free path,
    party_a.extractors.edge_free_path):

    * ``graph``: the extractor's slices alone, the decoder the extractor had without the path;
    * ``edge-free``: the path's slices alone, the MLP baseline's decoder;
    * ``combined``: every slice, read detached (it trains nothing at A).

    All three are trained every step, on the sum of their losses. A's extractor learns from the
    graph head's gradient and A's edge-free layers from the edge-free head's, each exactly as it
    would without the other; the combined head is B-side post-processing of both. After training
    B keeps the edge-free head unless another leads it on B's validation nodes by more than the
    paired noise there (party_b.head_choice; ``choose``); ``forward`` returns the kept head's
    logits (the edge-free head's until a choice is made).
    """

    def __init__(self, config: DecoderConfig, dim: int, layers: int, edge_free: int, classes: int) -> None:
        super().__init__()
        if not 1 <= edge_free < layers:
            raise ValueError(f"an edge-free path of {edge_free} of {layers} slices: it needs 1 to {layers - 1}")
        self.edge_free_layers = edge_free
        # the edge-free head first: under B's seed it starts as the MLP baseline's decoder would
        self.edge_free = build_decoder(config, dim, edge_free, classes)
        self.graph = build_decoder(config, dim, layers - edge_free, classes)
        self.combined = build_decoder(config, dim, layers, classes)
        # an index into HEADS; a buffer, so a saved decoder serves with the head B chose
        self.register_buffer("choice", torch.tensor(HEADS.index("edge-free"), dtype=torch.int64))

    def head(self, name: str, embeddings: torch.Tensor) -> torch.Tensor:
        """One head's logits of B x d x L embeddings (``name`` one of HEADS)."""
        split = embeddings.shape[-1] - self.edge_free_layers
        if name == "edge-free":
            return self.edge_free(embeddings[..., split:])
        if name == "graph":
            return self.graph(embeddings[..., :split])
        return self.combined(embeddings.detach())

    def heads(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each head's logits, in the order of HEADS."""
        return tuple(self.head(name, embeddings) for name in HEADS)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The chosen head's logits, computed alone (a prediction pass decodes with one head)."""
        return self.head(HEADS[int(self.choice)], embeddings)

    def choose(self, head: str) -> None:
        self.choice.fill_(HEADS.index(head))

    @property
    def chosen(self) -> str:
        return HEADS[int(self.choice)]


def build_decoder(
    config: DecoderConfig, dim: int, layers: int, classes: int, edge_free: int = 0,
) -> nn.Module:
    """B's decoder for B x dim x layers embeddings; ``edge_free`` > 0: a FallbackDecoder whose
    second head reads the last ``edge_free`` slices alone."""
    if edge_free:
        return FallbackDecoder(config, dim, layers, edge_free, classes)
    if config.kind == "concat":
        return ConcatDecoder(dim, layers, config.hidden_dim, classes, config.dropout)
    if config.kind == "gru":
        return GruDecoder(dim, config.hidden_dim, classes, config.dropout)
    raise ValueError(f"unknown decoder {config.kind!r}; expected concat or gru")
