"""Party A's secret generators of one run: neighbour sampling and noise, never derived from
anything B knows (common.secret_randomness), and where they stood before the first release."""

from __future__ import annotations

import torch

from vesper.common.config import PartyAConfig
from vesper.common.secret_randomness import secret_base
from vesper.party_a.keyed_dropout import draw_dropout_key

# Distinguishes the noise generator from the sampling generator of the same secret base.
_NOISE_LABEL = 0x5DEECE66D
# Distinguishes the edge-free layers' dropout secret (pmp_plugin.MlpPlugin) from both.
_EDGE_FREE_LABEL = 0x45444745 << 8  # "EDGE"
# Distinguishes a prediction pass's generators from the run's and from each other's.
_PREDICTION_LABEL = 0x50524544 << 16  # "PRED"


def prediction_label(pass_index: int) -> int:
    """The label of prediction pass ``pass_index``'s generators (fresh noise for each pass)."""
    return _PREDICTION_LABEL + pass_index + 1


class SecretGenerators:
    """The run's sampling and noise generators; ``initial`` is their state before anything is
    drawn, from which a resumed run replays. ``edge_free``: the secret of the edge-free layers'
    own dropout keys (pmp_plugin.MlpPlugin), from the same secret base under a label of its own,
    so that an MLP run and an extractor's edge-free path of the same secret base and run seed draw
    the same keys; a resumed run takes it from its resume record (None there: a run recorded
    before it existed, whose keys came from the sampling generator)."""

    def __init__(
        self, settings: PartyAConfig, run_seed: int, device: torch.device, resume: dict | None = None, label: int = 0,
    ) -> None:
        base = secret_base(settings.secret_seed, run_seed) ^ label
        self.sampling = torch.Generator().manual_seed(base)
        self.noise = torch.Generator(device=device).manual_seed(base ^ _NOISE_LABEL)
        self.edge_free: tuple[int, int] | None
        if resume:
            self.sampling.set_state(resume["sampling"])
            self.noise.set_state(resume["noise"])
            recorded = resume.get("edge_free")
            self.edge_free = None if recorded is None else (int(recorded[0]), int(recorded[1]))
        else:
            self.edge_free = draw_dropout_key(torch.Generator().manual_seed(base ^ _EDGE_FREE_LABEL))
        self.initial = (self.sampling.get_state(), self.noise.get_state())

    def state(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sampling.get_state(), self.noise.get_state()

    def restore(self, sampling: torch.Tensor, noise: torch.Tensor) -> None:
        self.sampling.set_state(sampling)
        self.noise.set_state(noise)
