"""Party A's secret generators of one run: neighbour sampling and noise, never derived from
anything B knows (common.secret_randomness), and where they stood before the first release."""

from __future__ import annotations

import torch

from vesper.common.config import PartyAConfig
from vesper.common.secret_randomness import secret_base

# Distinguishes the noise generator from the sampling generator of the same secret base.
_NOISE_LABEL = 0x5DEECE66D
# Distinguishes a prediction pass's generators from the run's and from each other's.
_PREDICTION_LABEL = 0x50524544 << 16  # "PRED"


def prediction_label(pass_index: int) -> int:
    """The label of prediction pass ``pass_index``'s generators (fresh noise for each pass)."""
    return _PREDICTION_LABEL + pass_index + 1


class SecretGenerators:
    """The run's sampling and noise generators; ``initial`` is their state before anything is
    drawn, from which a resumed run replays."""

    def __init__(
        self, settings: PartyAConfig, run_seed: int, device: torch.device, resume: dict | None = None, label: int = 0,
    ) -> None:
        base = secret_base(settings.secret_seed, run_seed) ^ label
        self.sampling = torch.Generator().manual_seed(base)
        self.noise = torch.Generator(device=device).manual_seed(base ^ _NOISE_LABEL)
        if resume:
            self.sampling.set_state(resume["sampling"])
            self.noise.set_state(resume["noise"])
        self.initial = (self.sampling.get_state(), self.noise.get_state())

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sampling.get_state(), self.noise.get_state()

    def restore(self, sampling: torch.Tensor, noise: torch.Tensor) -> None:
        self.sampling.set_state(sampling)
        self.noise.set_state(noise)
