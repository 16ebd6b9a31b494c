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
every other row, layer and release (docs/privacy.md, section 2.6); what the key buys is that a
node's noisy aggregate is the same value wherever it is computed in the release, so party A's
workers (``party_a.workers``), which may each reach the same node, release one mechanism
output for it, as one process does.
"""

from __future__ import annotations

import math

import torch

from vesper.party_a.sampler import pair_key_grid

NoiseKey = tuple[int, int]


def draw_noise_key(generator: torch.Generator) -> NoiseKey:
    """k_r: one release's noise key, two 32-bit words from A's secret noise generator."""
    first, second = torch.randint(
        0, 1 << 32, (2,), generator=generator, dtype=torch.int64, device=generator.device
    ).tolist()
    return int(first), int(second)


_SLOT_BITS = 20  # the hashed pair is (node, layer · 2²⁰ + slot): one slot per coordinate, < 2²⁰
_MAX_LAYER = (1 << (31 - _SLOT_BITS)) - 1  # slots stay below 2³¹ (pair_key_grid)
_TWO_32 = 4294967296.0


def _unsigned(bits: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns as the float64 values of their unsigned 32 bits, in [0, 2³²)."""
    return bits.to(torch.float64).add_(_TWO_32 * (bits < 0))


def keyed_normal(key: NoiseKey, layer: int, rows: torch.Tensor, width: int) -> torch.Tensor:
    """N(0, 1) per (row, coordinate), float32 [len(rows), width], a function of (key, layer, node, j) only.

    Box–Muller on the pair m = j // 2, with slots s = layer · 2²⁰ + 2m and s + 1 (distinct for
    every layer and coordinate below the bounds checked here) and h(k, v, s) the keyed 32-bit
    hash of the sampler (``pair_keys``): a radius from 53 bits, U₁ = 1 − U(k_r, v, s) ∈ (0, 1]
    with U the sampler's ``keyed_uniform`` (two hashes), and an angle from 32 bits,
    U₂ = h(k_r, v, s + 1) / 2³². Coordinate 2m is √(−2 ln U₁) cos 2πU₂ and 2m + 1 is
    √(−2 ln U₁) sin 2πU₂: two independent standard normals per pair of uniforms.
    """
    pairs = (width + 1) // 2
    if not 0 <= layer <= _MAX_LAYER or 2 * pairs > 1 << _SLOT_BITS:
        raise ValueError(
            f"keyed noise covers layers 0..{_MAX_LAYER} and rows of at most {1 << _SLOT_BITS} values, "
            f"got layer {layer} and width {width}"
        )
    nodes = rows.reshape(-1).to(torch.int64)
    slot = (layer << _SLOT_BITS) + 2 * torch.arange(pairs, dtype=torch.int64, device=nodes.device)
    # keyed_uniform(k_r, v, s), 53 bits: the high 32 from h(k_r, ·), the low 21 from h(swapped k_r, ·)
    high = _unsigned(pair_key_grid(key, nodes, slot))
    low = _unsigned(pair_key_grid((key[1], key[0]), nodes, slot))
    uniform = high.mul_(2.0**21).add_(low.mul_(2.0**-11).floor_()).mul_(2.0**-53)
    radius = uniform.neg_().log1p_().mul_(-2.0).sqrt_().to(torch.float32)
    angle = _unsigned(pair_key_grid(key, nodes, slot + 1)).mul_(2.0 * math.pi / _TWO_32).to(torch.float32)
    normal = torch.empty(nodes.shape[0], pairs, 2, dtype=torch.float32, device=nodes.device)
    torch.mul(radius, torch.cos(angle), out=normal[..., 0])
    torch.mul(radius, torch.sin(angle), out=normal[..., 1])
    return normal.reshape(nodes.shape[0], 2 * pairs)[:, :width]


class NoiseSource:
    """A's noise, drawn from A's secret generator (on A's device)."""

    def __init__(self, generator: torch.Generator, keyed: bool = False) -> None:
        self.generator = generator
        # whether per-node mechanisms key their noise (party A's workers need it: docs/privacy.md
        # 2.6); one process streams it, about five times cheaper per value
        self.keyed = keyed

    def draw_key(self) -> NoiseKey:
        """A fresh release's noise key (:func:`draw_noise_key`) from A's secret noise generator."""
        return draw_noise_key(self.generator)

    def standard_normal(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """N(0, 1) values drawn now from A's secret generator, for a :meth:`gaussian` call to come
        (``drawn=``): a release's streamed noise drawn ahead, in the order its calls would draw
        it (party A's prefetch draws step t+1's while B computes step t)."""
        return torch.randn(shape, generator=self.generator, device=self.generator.device, dtype=dtype)

    def gaussian(
        self, values: torch.Tensor, std: float, *, rows: torch.Tensor | None = None,
        key: NoiseKey | None = None, layer: int = 0, drawn: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ǎ = a + N(0, std² I): the Gaussian mechanism's perturb step. std = 0 returns ``values``.

        The result may be ``values`` itself, noised in place: callers pass a tensor they own
        (a fresh aggregate or sum) and use only what is returned. ``rows``: the node id of each
        row of ``values`` (None: not about nodes row by row). ``key``: the release's noise key
        (:meth:`draw_key`): the noise of row i is then keyed by (key, ``layer``, rows[i]) and
        nothing is drawn from the generator (:func:`keyed_normal`); it needs ``rows``, distinct
        within the call. ``drawn``: this call's N(0, 1) values, drawn ahead by :meth:`standard_normal`
        (streamed noise only), consumed here.
        """
        if std < 0:
            raise ValueError(f"a noise standard deviation must be >= 0, got {std}")
        if std == 0:
            return values
        if drawn is not None:
            if key is not None or drawn.shape != values.shape:
                raise ValueError(
                    f"noise drawn ahead of shape {tuple(drawn.shape)} for values of shape {tuple(values.shape)}"
                    + (" with a noise key (keyed noise is never drawn ahead)" if key is not None else "")
                )
            noise = drawn.to(device=values.device, dtype=values.dtype)
        elif key is not None:
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
