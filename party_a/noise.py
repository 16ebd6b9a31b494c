"""The one place party A's noise is drawn: every mechanism's ``perturb`` step calls it.

Every extractor adds its noise through the :class:`NoiseSource` it is handed
(``ExtractorSetup.noise``), never by calling ``torch.randn`` itself. That keeps two
promises checkable in one place:

* the noise comes from A's secret generator (``party_a.run.secrets.SecretGenerators``),
  never from anything B knows, and its state is what A's checkpoints save;
* every value that passes through a mechanism is seen here, with the node ids its rows
  are about, so the whole-release test (tests/test_release_independence.py) can record
  the mechanism's outputs on a graph G, substitute them on the neighbouring graph, and
  check that everything else A sends is identical (docs/privacy.md, section 2.3).

A mechanism call names its kind (``gaussian``: ǎ = a + N(0, σ² I); ``gumbel``: scores plus
Gumbel(0, b) noise for a one-shot exponential mechanism) and, where the rows of ``values``
are about nodes, ``rows``: their node ids (None: the tensor as a whole, e.g. a noised
gradient sum).
"""

from __future__ import annotations

import torch


class NoiseSource:
    """A's noise, drawn from A's secret generator (on A's device)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def gaussian(self, values: torch.Tensor, std: float, *, rows: torch.Tensor | None = None) -> torch.Tensor:
        """ǎ = a + N(0, std² I): the Gaussian mechanism's perturb step. std = 0 returns ``values``.

        The result may be ``values`` itself, noised in place: callers pass a tensor they own
        (a fresh aggregate or sum) and use only what is returned. ``rows``: the node id of each
        row of ``values`` (None: not about nodes row by row).
        """
        if std < 0:
            raise ValueError(f"a noise standard deviation must be >= 0, got {std}")
        if std == 0:
            return values
        noise = torch.randn(values.shape, generator=self.generator, device=values.device, dtype=values.dtype)
        return values.add_(noise.mul_(std)) if not values.requires_grad else values + noise.mul_(std)

    def gumbel(self, values: torch.Tensor, scale: float, *, rows: torch.Tensor | None = None) -> torch.Tensor:
        """u + Gumbel(0, b) for every score: −b·log(E), E ~ Exp(1) (one-shot exponential mechanism).

        E is kept ≥ the smallest normal float: a sampler returning exactly 0 (probability ~2⁻²⁴
        per draw in float32) would otherwise force +∞ into a top-K. In place, like :meth:`gaussian`.
        """
        if scale < 0:
            raise ValueError(f"a Gumbel scale must be >= 0, got {scale}")
        if scale == 0:
            return values
        exponential = torch.empty(values.shape, device=values.device, dtype=values.dtype)
        exponential.exponential_(generator=self.generator)
        noise = exponential.clamp_(min=torch.finfo(values.dtype).tiny).log_().mul_(-scale)
        return values.add_(noise)
