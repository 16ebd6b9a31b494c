"""Party B's decoder dropout: a generator of its own, so a run repeats exactly.

``nn.Dropout`` draws from torch's process-wide RNG, which nothing seeds per run (torch
seeds it at random in every process): two runs with the same seeds then differ by
their dropout masks, and two runs sharing a process share one stream. Each
``SeededDropout`` takes its seed from torch's RNG when it is built — B builds its decoder
under ``common.seeded_init.seeded(config.seed)`` — and keeps a generator of its own,
made on the device of the first input it sees.

Only B uses it: B's decoder reads no edge, so a stream seeded from the public seed leaks
nothing of A's graph. Party A's dropout runs over A's graph and is keyed instead
(party_a.keyed_dropout, docs/privacy.md section 2.3).
"""

from __future__ import annotations

import torch
from torch import nn


class SeededDropout(nn.Module):
    """Inverted dropout (scale kept units by 1/(1 − p)) with a generator of its own."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.seed = int(torch.randint(0, 1 << 62, ()).item())
        self._generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self._generator is None or self._generator.device != x.device:
            self._generator = torch.Generator(device=x.device).manual_seed(self.seed)
        keep = torch.rand(x.shape, generator=self._generator, device=x.device, dtype=x.dtype) >= self.p
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def dropout_states(module: nn.Module) -> list[torch.Tensor | None]:
    """Where each ``SeededDropout`` in ``module`` is in its stream (None: not drawn from yet),
    for a checkpoint; a resumed run draws the same masks as one never interrupted."""
    return [
        None if m._generator is None else m._generator.get_state()
        for m in module.modules() if isinstance(m, SeededDropout)
    ]


def restore_dropout_states(module: nn.Module, states: list[torch.Tensor | None], device: torch.device) -> None:
    layers = [m for m in module.modules() if isinstance(m, SeededDropout)]
    if len(layers) != len(states):
        raise ValueError(f"checkpoint has {len(states)} dropout states for {len(layers)} dropout layers")
    for layer, state in zip(layers, states, strict=True):
        layer._generator = None
        if state is not None:
            layer._generator = torch.Generator(device=device)
            layer._generator.set_state(state)
