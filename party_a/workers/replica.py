"""A worker's copy of the run's extractor: built as rank 0 built it, fed rank 0's parameters
and generator states before each release, so its share of a release is what one process
would compute for those roots (docs/privacy.md, section 2.6)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vesper.common.config import RunConfig
from vesper.party_a.extractors.base import Extractor, ExtractorSetup
from vesper.party_a.extractors.edge_free_path import build_extractor, unwrapped
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.workers.gradients import flat_gradients
from vesper.party_a.workers.protocol import ReleaseCommand, WorkerSetup, share_bounds


def worker_device(device: str, rank: int) -> torch.device:
    """A worker's device: party A's, or, for ``cuda`` on a host with several GPUs, cuda:(rank mod GPUs)."""
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        return torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    return torch.device(device)


@dataclass
class Replica:
    extractor: Extractor
    rank: int
    output: torch.Tensor | None = None  # the rows of the last release, with gradient while training
    bounds: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def build(cls, setup: WorkerSetup, states: tuple[torch.Tensor, torch.Tensor], rank: int) -> Replica:
        """The run's extractor on the memory-mapped dataset, from the generators' state at rank 0's build."""
        config = RunConfig.model_validate_json(setup.run_config_json)
        device = worker_device(setup.device, rank)
        data = GraphData.load(setup.dataset, device)
        sampling = torch.Generator()
        noise = torch.Generator(device=device)
        sampling.set_state(states[0])
        noise.set_state(states[1])
        plugin = lookup(config.extractor.name)
        extractor = build_extractor(plugin, ExtractorSetup(
            config=config, params=validated_params(plugin.spec, config), graph=data.graph, features=data.features,
            device=device, sampling_generator=sampling, noise_generator=noise, delta=setup.delta, keyed_noise=True,
            edge_free_key=setup.edge_free_key,
        ))
        return cls(extractor, rank)

    @property
    def setup(self) -> ExtractorSetup:
        """The replica's set-up: its memory-mapped graph and its (keyed) noise source."""
        return unwrapped(self.extractor).setup  # type: ignore[attr-defined]

    def release(self, command: ReleaseCommand) -> torch.Tensor | None:
        """This rank's share of the release (None: an empty share), from rank 0's state."""
        ex, setup = self.extractor, self.extractor.setup
        if command.parameters is not None:
            ex.load_state_dict(command.parameters)
        setup.sampling_generator.set_state(command.sampling_state)
        setup.noise.generator.set_state(command.noise_state)
        ex.train(command.training)
        ex.noise_std = command.noise_std  # type: ignore[attr-defined]  # the PMP plugins' θ = z · S
        self.bounds = share_bounds(command.shares)
        share = command.shares[self.rank]
        self.output = None
        if not share.numel():
            return None
        with torch.set_grad_enabled(command.training):
            self.output = ex.release(share.to(setup.device), command.kind)  # type: ignore[arg-type]
        return self.output.detach().cpu()

    def backward(self, gradient: torch.Tensor) -> torch.Tensor:
        """Back-propagate this rank's rows of B's gradient; the parameter gradients, flat."""
        parameters = self.extractor.trainable_parameters()
        for p in parameters:
            p.grad = None
        if self.output is not None and self.output.requires_grad:
            start, end = self.bounds[self.rank]
            self.output.backward(gradient[start:end].to(self.output.device, self.output.dtype))
        self.output = None
        return flat_gradients(parameters)
