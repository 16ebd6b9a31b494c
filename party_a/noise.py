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

Keyed Gaussian noise (``key=``, with ``rows``): the noise of row v, coordinate j of mechanism
``layer`` in one release is a function of (the release's secret noise key, layer, v, j) alone,
like party A's dropout masks (``party_a.keyed_dropout``): two Box–Muller normals from keyed
uniforms (``party_a.sampler.keyed_uniform``). Each row is still N(0, σ² I), independent of
every other row, layer and release (docs/privacy.md, section 2.5); what the key buys is that a
node's noisy aggregate is the same value wherever it is computed in the release, so party A's
workers (``party_a.workers``), which may each reach the same node, release one mechanism
output for it, as one process does.
"""

from __future__ import annotations

import math

import torch

from vesper.party_a.sampler import keyed_uniform

NoiseKey = tuple[int, int]


def draw_noise_key(generator: torch.Generator) -> NoiseKey:
    """k_r: one release's noise key, two 32-bit words from A's secret noise generator."""
    first, second = torch.randint(
        0, 1 << 32, (2,), generator=generator, dtype=torch.int64, device=generator.device
    ).tolist()
    return int(first), int(second)


_SLOT_BITS = 20  # the hashed pair is (node, layer · 2²⁰ + slot): one slot per coordinate, < 2²⁰
_MAX_LAYER = (1 << (32 - _SLOT_BITS)) - 1


def keyed_normal(key: NoiseKey, layer: int, rows: torch.Tensor, width: int) -> torch.Tensor:
    """N(0, 1) per (row, coordinate), float64 [len(rows), width], a function of (key, layer, node, j) only.

    Box–Muller on the pair m = j // 2, with slots s = layer · 2²⁰ + 2m and s + 1 (distinct for
    every layer and coordinate below the bounds checked here): U₁ = 1 − keyed_uniform(k_r, v, s)
    ∈ (0, 1] and U₂ = keyed_uniform(k_r, v, s + 1); coordinate 2m is √(−2 ln U₁) cos 2πU₂ and
    2m + 1 is √(−2 ln U₁) sin 2πU₂: two independent standard normals per pair of uniforms.
    """
    pairs = (width + 1) // 2
    if not 0 <= layer <= _MAX_LAYER or 2 * pairs > 1 << _SLOT_BITS:
        raise ValueError(
            f"keyed noise covers layers 0..{_MAX_LAYER} and rows of at most {1 << _SLOT_BITS} values, "
            f"got layer {layer} and width {width}"
        )
    nodes = rows.to(torch.int64).reshape(-1, 1)
    slot = (layer << _SLOT_BITS) + 2 * torch.arange(pairs, dtype=torch.int64, device=nodes.device).reshape(1, -1)
    radius = torch.sqrt(-2.0 * torch.log1p(-keyed_uniform(key, nodes, slot)))
    angle = (2.0 * math.pi) * keyed_uniform(key, nodes, slot + 1)
    normal = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1)
    return normal.reshape(nodes.shape[0], 2 * pairs)[:, :width]


class NoiseSource:
    """A's noise, drawn from A's secret generator (on A's device)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def draw_key(self) -> NoiseKey:
        """A fresh release's noise key (:func:`draw_noise_key`) from A's secret noise generator."""
        return draw_noise_key(self.generator)

    def gaussian(
        self, values: torch.Tensor, std: float, *, rows: torch.Tensor | None = None,
        key: NoiseKey | None = None, layer: int = 0,
    ) -> torch.Tensor:
        """ǎ = a + N(0, std² I): the Gaussian mechanism's perturb step. std = 0 returns ``values``.

        The result may be ``values`` itself, noised in place: callers pass a tensor they own
        (a fresh aggregate or sum) and use only what is returned. ``rows``: the node id of each
        row of ``values`` (None: not about nodes row by row). ``key``: the release's noise key
        (:meth:`draw_key`): the noise of row i is then keyed by (key, ``layer``, rows[i]) and
        nothing is drawn from the generator (:func:`keyed_normal`); it needs ``rows``, distinct
        within the call.
        """
        if std < 0:
            raise ValueError(f"a noise standard deviation must be >= 0, got {std}")
        if std == 0:
            return values
        if key is not None:
            if rows is None or rows.shape != values.shape[:1]:
                raise ValueError(
                    "keyed noise needs the node id of every row of the values (rows=, one per row): "
                    "the key makes each row's noise a function of its node"
                )
            width = values[0].numel() if values.shape[0] else 0
            noise = keyed_normal(key, layer, rows, width).to(device=values.device, dtype=values.dtype)
            noise = noise.reshape(values.shape)
        else:
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
